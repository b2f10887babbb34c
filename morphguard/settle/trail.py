"""The audit trail of every accepted request, and what sends its escalations.

Every request the proxy accepted ends as exactly one audit row: checked (`settle.check.Settler` hands its record
here), or not checked with a short reason code (`account`: `no_context`, `queue_full`, `queue_unavailable`,
`upstream_timeout`, ...). The row is keyed by request id (a second write of it changes nothing) and carries its
escalation's outbox row in the same transaction; the escalation is sent only once both are committed.

No answer goes out before its row is committed. While the store cannot write (PostgreSQL unreachable, SQLite's disk
full, read-only or failing), the answer waits for its row up to `policy.audit.wait_s`; past that the client gets a
503 `store_unavailable` with `Retry-After` instead, and the row (its reason saying `store_unavailable`) is owed:
written from the background once the store is back (a queued check waits for the store instead: `wait_for_store`).
A row the database refuses is written without its texts and counted (`audit_failures`, in /readyz and a metric),
never skipped silently. Streams under way are journaled beside the trail (`settle.stream_journal`), so a process
killed mid-stream leaves their rows to the next start (`recover_streams`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from tenacity import AsyncRetrying, retry_if_exception, stop_before_delay, stop_never, wait_exponential_jitter

from morphguard import telemetry
from morphguard.config import Config
from morphguard.errors import store_unavailable
from morphguard.models import Decision
from morphguard.policy.audit import AuditStore, Written
from morphguard.policy.audit_writer import AuditWriter
from morphguard.policy.engine import Finding, PolicyEngine
from morphguard.policy.record import DecisionRecord, Released
from morphguard.settle.escalation import Escalator
from morphguard.settle.outage import Outage
from morphguard.settle.stream_journal import OpenStream, StreamJournal
from morphguard.settle.values import CheckOutcome, CheckRequest

log = logging.getLogger(__name__)

# Reasons for not checking that are policy working as configured; every other reason is also an error metric.
_ROUTINE = frozenset({"no_context", "unchecked_route"})
RETRY_WAIT_MAX_S = 5.0  # the longest pause between two tries of a store that cannot write; also the Retry-After


class Trail:
    def __init__(self, config: Config, engine: PolicyEngine, audit: AuditStore | None, escalator: Escalator) -> None:
        self.config = config
        self.engine = engine
        self.audit = audit
        self._rows = AuditWriter(audit, escalator.owner) if audit is not None else None
        self.escalator = escalator
        self.background: set[asyncio.Task[Any]] = set()  # rows written later: a cancelled stream, a store away
        self._owed: set[str] = set()  # request ids refused for want of the store, their rows written later
        self.audit_failures = 0
        self._store = Outage("audit store", log)
        # Streams under way, so that a crash mid-stream still leaves their rows (written by the next start).
        self.streams = _journal(Path(config.policy.audit.path).with_suffix(".streams")) if audit is not None else None

    async def record(self, record: DecisionRecord, wait_for_store: bool = False) -> None:
        """The audit row (with its escalation's outbox row), then the escalation.

        If the store cannot write: `wait_for_store` waits, retrying, until it can; otherwise the caller waits up to
        `policy.audit.wait_s`, then the row is owed (written from the background) and a 503 is raised. A request
        whose row is owed already is not written again (its first row stands).
        """
        if self._rows is None:
            if record.escalated:
                self.escalator.submit(record.escalation())
            return
        if record.request_id in self._owed:
            return
        if wait_for_store:
            await self._write(record, None)
            return
        deadline = asyncio.get_running_loop().time() + self.config.policy.audit.wait_s
        try:
            await self._write(record, deadline)
        except Exception:  # the store could not write within the bound (a refused row is handled in _write)
            owed = record.model_copy(update={"reason": f"{record.reason or ''} store_unavailable".strip()})
            self._owed.add(record.request_id)
            self.in_background(self._write_owed(owed))
            raise store_unavailable(RETRY_WAIT_MAX_S) from None

    async def _write_owed(self, record: DecisionRecord) -> None:
        try:
            await self._write(record, None)
        finally:
            self._owed.discard(record.request_id)

    async def _write(self, record: DecisionRecord, deadline: float | None) -> None:
        """Commit the row, and send its escalation once committed; a row the database refuses is written
        again without its texts. Raises only when the store cannot write by `deadline` (None: it waits)."""
        assert self.audit is not None
        try:
            written = await self._commit(record, deadline)
        except Exception as exc:
            if self.audit.unavailable(exc):
                raise
            log.error("request %s: audit record failed (%s); recording it without its texts", record.request_id,
                      exc)
            self.audit_failures += 1
            telemetry.count_error("audit_failed")
            record = record.model_copy(update={"question": None, "answer": None, "context": None, "factoids": [],
                                               "reason": f"{record.reason or ''} audit_failed".strip()})
            try:
                written = await self._commit(record, deadline)
            except Exception as again:
                if self.audit.unavailable(again):
                    raise
                log.exception("request %s: audit trail unavailable", record.request_id)
                return
        if written.outbox_id is not None:
            self.escalator.submit(record.escalation(), written.outbox_id)

    async def _commit(self, record: DecisionRecord, deadline: float | None) -> Written:
        """One commit through the writer; while the store cannot write, again with backoff until `deadline`
        (None: until it can)."""
        assert self._rows is not None and self.audit is not None
        rows, audit = self._rows, self.audit
        loop = asyncio.get_running_loop()
        try:  # the first attempt without the retrying machinery: it is on every request's path
            written = await rows.write(record)
        except Exception as exc:
            if not audit.unavailable(exc):
                raise
            self._store.failed(exc)
            if deadline is not None and loop.time() >= deadline:
                raise
        else:
            self._store.ok()
            return written
        stop = stop_never if deadline is None else stop_before_delay(max(0.0, deadline - loop.time()))
        async for attempt in AsyncRetrying(retry=retry_if_exception(audit.unavailable), stop=stop,
                                           wait=wait_exponential_jitter(initial=0.2, max=RETRY_WAIT_MAX_S),
                                           reraise=True):
            with attempt:
                try:
                    written = await rows.write(record)
                except Exception as exc:
                    if audit.unavailable(exc):
                        self._store.failed(exc)
                    raise
        self._store.ok()
        return written

    @property
    def store_writes(self) -> bool:
        """False while the audit store cannot write (from the last write tried: a read does not tell)."""
        return not self._store.down

    def in_background(self, work: Awaitable[Any]) -> None:
        """Work that must end in a record though nobody awaits it; stop() gives it the grace period."""
        task = asyncio.ensure_future(work)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    def unchecked(self, request: CheckRequest, reason: str, *, failed: bool = False) -> Decision:
        """Policy's decision on a request that ends without a check for `reason`; `failed`: an answer the check could
        not read, decided as the profile's `on_error` says (pass or block)."""
        finding = Finding(failed=reason) if failed else Finding(skipped=reason)
        return self.engine.decide(request.profile, request.topic, finding)

    async def account(self, request: CheckRequest, reason: str, answer: str | None = None, *,
                      wait_for_store: bool = False, failed: bool = False, released: Released | None = None,
                      decision: Decision | None = None) -> DecisionRecord:
        """Record a request that ends without a check (an upstream failure, no context, a full queue), decided by
        `unchecked` unless `decision` is policy's decision on it already; `released`: what of a stream's answer text
        the client was sent before it ended."""
        if decision is None:
            decision = self.unchecked(request, reason, failed=failed)
        result = CheckOutcome(decision, None, 0.0)
        with telemetry.guardrail_span(request.request_id, "inline") as span:
            telemetry.record_check(span, span, decision=result.decision, detection=None)
            record = result.record(request, answer=answer or "", trace_id=telemetry.trace_id(span))
        if released is not None:
            record = record.model_copy(update=released.fields())
        if reason not in _ROUTINE:
            telemetry.count_error(reason)
        await self.record(record, wait_for_store)
        return record

    def account_soon(self, request: CheckRequest, reason: str, answer: str | None = None,
                     released: Released | None = None, stream: OpenStream | None = None) -> None:
        """`account` from where awaiting is no longer possible (a cancelled stream); done before shutdown. The
        stream's journal entry ends once the row is written."""
        async def account() -> None:
            await self.account(request, reason, answer, wait_for_store=True, released=released)
            if stream is not None:
                stream.ended()

        self.in_background(account())

    def open_stream(self, request: CheckRequest) -> OpenStream | None:
        """Journal a stream whose first text is about to go out (None: no audit trail to write it to). What its row
        needs, never the body; the question and passages only where the trail keeps texts whole (`store_text: full`),
        so the journal holds no text the trail would not."""
        if self.streams is None:
            return None
        kept = self.config.policy.audit.store_text == "full"
        return self.streams.open({**request.to_dict(), "body": {}, **({} if kept else {"rag": None})})

    async def recover_streams(self) -> int:
        """Record the streams a process that died mid-stream left open: not checked (`stream_interrupted`, decided
        as the profile's `on_error` says), with what their clients had received. How many."""
        if self.streams is None:
            return 0
        count = 0
        for path, streams in await asyncio.to_thread(StreamJournal.left_behind, self.streams.folder):
            for data, chars in streams:
                # a check that could not be made: the profile's on_error decides, and escalates where it escalates
                await self.account(CheckRequest.from_dict(data), "stream_interrupted", wait_for_store=True,
                                   failed=True, released=Released(chars))
            StreamJournal.forget(path)
            count += len(streams)
        return count

    def escalation_backlog(self) -> dict[str, int]:
        """Escalations waiting for the webhook: pending (being tried) and undelivered (tried again later).
        Blocking: call it off the loop."""
        if self.audit is None:
            return {}
        states = self.audit.escalation_states()
        return {"pending": states.get("pending", 0), "undelivered": states.get("undelivered", 0),
                "retrying": self.audit.escalation_backlog() - states.get("pending", 0)}

    async def close(self) -> None:
        if self.streams is not None:
            self.streams.close()
        if self._rows is not None:
            await asyncio.to_thread(self._rows.close)
        if self.audit is not None:
            await asyncio.to_thread(self.audit.close)


def _journal(folder: Path) -> StreamJournal | None:
    """The stream journal in `folder`; None, said once in the log, where the folder cannot be written (a read-only
    root file system): the proxy serves, and a crash mid-stream then leaves no row for those streams."""
    try:
        return StreamJournal(folder)
    except OSError as exc:
        log.warning("streams are not journaled: %s cannot be written (%s); put policy.audit.path on a writable "
                    "volume", folder, exc.strerror or exc)
        return None
