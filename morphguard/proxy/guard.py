"""Carrying out what policy decided about an answer, and the audit trail of every accepted request.

`settle` checks an answer (`proxy.checker`), has policy decide on it once (`policy.engine.PolicyEngine.decide`,
given what the answer's way out can still change), carries that decision out (re-asking the upstream for
`regenerate`, `policy.actions` for the rest), then audits and escalates; nothing here changes the action. `check_later`
queues the check instead (async mode), where the answer has already left and only annotating, auditing and
escalating remain possible; `proxy.consumer` runs what is queued. Every request the proxy accepted ends as
exactly one audit row: checked, or not checked with a short reason code (`no_context`, `queue_full`,
`queue_unavailable`, `upstream_timeout`, ...). The row is keyed by request id (a second write of it changes
nothing) and carries its escalation's outbox row in the same transaction; the escalation is sent only once
both are committed.

No answer goes out before its row is committed. While the store cannot write (PostgreSQL unreachable, SQLite's disk
full, read-only or failing), the answer waits for its row up to `policy.audit.wait_s`; past that the client gets a
503 `store_unavailable` with `Retry-After` instead, and the row (its reason saying `store_unavailable`) is owed:
written from the background once the store is back (a queued check waits for the store instead: `wait_for_store`).
A row the database refuses is written without its texts and counted (`audit_failures`, in /readyz and a metric),
never skipped silently.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from opentelemetry.trace import Span
from tenacity import AsyncRetrying, retry_if_exception, stop_before_delay, stop_never, wait_exponential_jitter

from morphguard import telemetry
from morphguard.config import Config
from morphguard.detectors import Detector
from morphguard.detectors.memo import Memo
from morphguard.models import Detection
from morphguard.policy import actions
from morphguard.policy.audit import AuditStore, Written
from morphguard.policy.audit_writer import AuditWriter
from morphguard.policy.engine import Finding, PolicyEngine, Reach, flags
from morphguard.policy.record import DecisionRecord, Released
from morphguard.proxy.check import Answer, CheckOutcome, CheckRequest, Found, Settled
from morphguard.proxy.checker import Checker
from morphguard.proxy.errors import store_unavailable
from morphguard.proxy.escalation import Escalator
from morphguard.proxy.journal import Journal
from morphguard.proxy.outage import Outage
from morphguard.proxy.shadow import Shadow
from morphguard.proxy.stream_journal import OpenStream, StreamJournal
from morphguard.store import open_queue
from morphguard.store.detections import DetectionCache
from morphguard.store.queue import CheckQueue, QueueUnavailable
from morphguard.store.redis_queue import RedisCheckQueue

log = logging.getLogger(__name__)

Reask = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
# Reasons for not checking that are policy working as configured; every other reason is also an error metric.
_ROUTINE = frozenset({"no_context", "unchecked_route"})
RETRY_WAIT_MAX_S = 5.0  # the longest pause between two tries of a store that cannot write; also the Retry-After


class Guard:
    def __init__(self, checker: Checker, engine: PolicyEngine, config: Config, audit: AuditStore | None,
                 escalator: Escalator, queue: CheckQueue, shared: RedisCheckQueue | None = None) -> None:
        self.checker = checker
        self.engine = engine
        self.config = config
        self.settings = config.proxy
        self.audit = audit
        self._rows = AuditWriter(audit, escalator.owner) if audit is not None else None
        self.escalator = escalator
        self.queue = queue
        self.shared = shared  # the fleet's Redis queue, when there is one
        self.background: set[asyncio.Task[Any]] = set()  # rows written later: a cancelled stream, a store away
        self._owed: set[str] = set()  # request ids refused for want of the store, their rows written later
        self.audit_failures = 0
        telemetry.labels.configure(config)  # the metrics this guard emits carry labels from this config only
        telemetry.prime()
        self._store = Outage("audit store", log)
        self.queue_outage = Outage("async check queue", log)
        self._queue_full = Outage("room in the async check queue", log)
        # What this process queued on Redis, until recorded: queued again if Redis comes back without it.
        self.journal = Journal() if shared is not None and audit is not None else None
        self.shadow = Shadow(config, audit) if config.shadow.sample > 0 else None
        # Streams under way, so that a crash mid-stream still leaves their rows (written by the next start).
        self.streams = _journal(Path(config.policy.audit.path).with_suffix(".streams")) if audit is not None else None

    async def find(self, request: CheckRequest, answer: Answer, memo: Memo | None = None) -> Found:
        """The check of the answer's text (no decision, no side effects); `memo`: shared by the checks of one
        stream (`Checker.memo`)."""
        return await self.checker.find(request, answer, memo)

    def decide(self, request: CheckRequest, answer: Answer, found: Found, reach: Reach) -> CheckOutcome:
        """Policy's one decision on what the check found in this answer, as far as `reach` lets it act."""
        decision = self.engine.decide(request.profile, request.topic, found.finding, answer.holds(), reach)
        if found.finding.failed is not None:
            log.warning("request %s %s unchecked (%s): %s", request.request_id,
                        "passed" if decision.action == "pass" else "blocked", decision.reason, found.error)
        return CheckOutcome(decision, found.finding.detection, found.latency_ms)

    def checked_text(self, answer: Answer) -> str:
        """What the check reads of an answer (and the audit row keeps)."""
        return self.checker.answer_text(answer)

    async def settle(self, request: CheckRequest, answer: Answer, reach: Reach, *,
                     reask: Reask | None = None) -> Settled:
        """Check the answer, decide, carry the decision out and audit it: the answer as the client gets it (in the
        chat shape; writing it back into the API's is the caller's), and the record. `reask`: how to ask the
        provider again, given where `reach` is `ASK_AGAIN`. The check's span is a child of the current (the
        provider call's) span, and the evaluation event goes on that span while it is open."""
        assert (reask is not None) == (reach is Reach.ASK_AGAIN), "regenerate needs a way to ask again"
        with telemetry.guardrail_span(request.request_id, "inline") as span:
            outcome = self.decide(request, answer, await self.find(request, answer), reach)
            settled = await self._carry_out(span, request, answer, outcome, reask)
        await self._record(settled.record)
        self._shadowed(request, settled.record)
        return settled

    async def settle_queued(self, request: CheckRequest, answer: Answer) -> Settled:
        """`settle` of an answer that went out before its check (a queued check): its own trace, linked to the
        request's, and returned only once its record is committed (the queue entry is acknowledged after that)."""
        link = request.chat_span.get_span_context() if request.chat_span else None
        with telemetry.guardrail_span(request.request_id, "async", link_to=link) as span:
            outcome = self.decide(request, answer, await self.find(request, answer), Reach.NONE)
            settled = await self._carry_out(span, request, answer, outcome, None)
        await self._record(settled.record, wait_for_store=True)
        self._shadowed(request, settled.record)
        return settled

    async def carry_out(self, request: CheckRequest, answer: Answer, outcome: CheckOutcome,
                        released: Released | None = None) -> Settled:
        """Carry out and audit a decision already made (a stream checked as it flows decides as it goes; a gateway's
        choices are decided together before any is recorded); `released`: what of the answer the client has, where
        some of it went out before the verdict."""
        with telemetry.guardrail_span(request.request_id, "inline") as span:
            settled = await self._carry_out(span, request, answer, outcome, None)
        record = settled.record if released is None else settled.record.model_copy(update=released.fields())
        await self._record(record)
        self._shadowed(request, record)
        return Settled(settled.answer, record)

    async def _carry_out(self, span: Span, request: CheckRequest, answer: Answer, outcome: CheckOutcome,
                         reask: Reask | None) -> Settled:
        """The action: a regeneration (the answer asked for again until one passes, the best kept), or what
        `policy.actions` does to the answer; then the evaluation on the spans and the record. The action is the
        decision's; for a regeneration the record's verdict is the regenerated answer's."""
        decision, detection, attempts = outcome.decision, outcome.detection, 0
        completion = answer.completion
        if decision.action == "regenerate" and reask is not None and detection is not None:
            completion, found, attempts = await self._regenerate(request, answer, outcome, reask)
            if attempts:
                detection = found.finding.detection
                flagged = detection is not None and flags(decision, detection)
                decision = decision.model_copy(update={"flagged": flagged, "escalate": decision.escalate and flagged})
                outcome = CheckOutcome(decision, detection, found.latency_ms)
        checked_answer = self.checker.answer_text(Answer(completion))  # the audit keeps what the model said
        if decision.action != "regenerate" and actions.changes(decision, detection):
            passages = request.rag.passages if request.rag else []
            # pure Python over the answer and the context (`cite` looks up sources): off the event loop. An answer
            # the action leaves as it is stays on the loop: a hand-over to a thread and back wakes both.
            completion = await asyncio.to_thread(actions.apply, completion, decision, detection, passages,
                                                 self.config.policy)
        chat = request.chat_span
        evaluated = chat if chat is not None and chat.is_recording() else span
        telemetry.record_check(span, evaluated, decision=decision, detection=detection,
                               question=request.rag.question if request.rag else None,
                               context=request.rag.passages if request.rag else None, answer=checked_answer)
        record = outcome.record(request, answer=checked_answer, regenerations=attempts,
                                trace_id=telemetry.trace_id(span))
        return Settled(Answer(completion, answer.response), record)

    async def _regenerate(self, request: CheckRequest, answer: Answer, first: CheckOutcome,
                          reask: Reask) -> tuple[dict[str, Any], Found, int]:
        """Re-ask with the unsupported claims named, re-check, keep the best; stop once an answer passes. The
        best answer, what the check found in it and how many times the provider was asked again."""
        assert first.detection is not None
        best, best_found, attempts = answer.completion, Found(Finding(detection=first.detection), first.latency_ms), 0
        latest: Detection | None = first.detection
        for _ in range(self.config.policy.regenerate.max_attempts):
            if latest is None:
                break
            body = actions.regeneration_body(request.body, latest, first.decision.threshold, self.config.policy)
            try:
                candidate = await reask(body)
            except Exception as exc:  # the upstream failed on the re-ask: keep what we have
                log.warning("request %s: regeneration failed: %s", request.request_id, exc)
                break
            attempts += 1
            found = await self.checker.find(request, Answer(candidate))
            latest = found.finding.detection
            best_detection = best_found.finding.detection
            if latest is not None and (best_detection is None or latest.score < best_detection.score):
                best, best_found = candidate, found
            if latest is not None and not flags(first.decision, latest):
                break
        return best, best_found, attempts

    async def _record(self, record: DecisionRecord, wait_for_store: bool = False) -> None:
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

    def _shadowed(self, request: CheckRequest, record: DecisionRecord) -> None:
        """A recorded request offered to the shadow candidate, which checks it after the answer has gone."""
        if self.shadow is not None:
            try:
                self.shadow.offer(request, record)
            except Exception:  # the shadow's failure is its own, never the request's
                log.exception("shadow: request %s not offered", request.request_id)

    @property
    def store_writes(self) -> bool:
        """False while the audit store cannot write (from the last write tried: a read does not tell)."""
        return not self._store.down

    def in_background(self, work: Awaitable[Any]) -> None:
        """Work that must end in a record though nobody awaits it; stop() gives it the grace period."""
        task = asyncio.ensure_future(work)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def account(self, request: CheckRequest, reason: str, answer: str | None = None, *,
                      wait_for_store: bool = False, failed: bool = False,
                      released: Released | None = None) -> DecisionRecord:
        """Record a request that ends without a check (an upstream failure, no context, a full queue).
        `failed`: an answer the check could not read, decided as the profile's `on_error` says (pass or block);
        `released`: what of a stream's answer text the client was sent before it ended."""
        finding = Finding(failed=reason) if failed else Finding(skipped=reason)
        result = CheckOutcome(self.engine.decide(request.profile, request.topic, finding), None, 0.0)
        with telemetry.guardrail_span(request.request_id, "inline") as span:
            telemetry.record_check(span, span, decision=result.decision, detection=None)
            record = result.record(request, answer=answer or "", trace_id=telemetry.trace_id(span))
        if released is not None:
            record = record.model_copy(update=released.fields())
        if reason not in _ROUTINE:
            telemetry.count_error(reason)
        await self._record(record, wait_for_store)
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

    async def check_later(self, request: CheckRequest, answer: Answer) -> DecisionRecord | None:
        """Queue a check durably; the record to send now, or None when the caller must check inline.

        A queue that is full, or cannot be reached, gets `proxy.on_queue_full`: check inline, or record the
        request as not checked. While the queue is known to be away no put is tried: the observer finds
        it back.
        """
        if request.rag is None:
            return await self.account(request, "no_context", self.checker.answer_text(answer))
        payload = {"request": request.to_dict(), "completion": answer.completion}
        reason = "queue_unavailable"
        if not self.queue_outage.down:
            try:
                stored = await self.queue.put(request.request_id, payload)
            except QueueUnavailable as exc:
                self.queue_outage.failed(exc)
            else:
                self.queue_outage.ok()
                if stored:
                    self._queue_full.ok()
                    if self.journal is not None:
                        assert self.shared is not None
                        self.journal.add(request.request_id, payload, self.shared.epoch)
                    return request.pending("queued")
                reason = "queue_full"
                self._queue_full.failed(RuntimeError(f"{self.settings.queue_size} checks waiting"))
        if self.settings.on_queue_full == "inline":
            return None
        return await self.account(request, reason, self.checker.answer_text(answer))

    def escalation_backlog(self) -> dict[str, int]:
        """Escalations waiting for the webhook: pending (being tried) and undelivered (tried again later).
        Blocking: call it off the loop."""
        if self.audit is None:
            return {}
        states = self.audit.escalation_states()
        return {"pending": states.get("pending", 0), "undelivered": states.get("undelivered", 0),
                "retrying": self.audit.escalation_backlog() - states.get("pending", 0)}

    async def close(self) -> None:
        if self.shadow is not None:
            await self.shadow.drain()
        if self.streams is not None:
            self.streams.close()
        await self.queue.close()
        await self.checker.aclose()
        if self.checker.cache is not None:
            await self.checker.cache.close()
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


def build_guard(config: Config, detector: Detector, engine: PolicyEngine) -> Guard:
    """A guard on the configured stores: the audit trail, the escalation outbox, the check queue and,
    for a fleet, the shared verdict cache. Blocking (it connects and migrates): call it off the loop."""
    policy = config.policy
    audit = AuditStore(policy.audit, config.store) if policy.audit.enabled else None
    budgets = [p.latency_budget_s or 0.0 for p in policy.profiles.values()]
    call_timeout_s = min([config.queue.timeout_s, *(b for b in budgets if b > 0)])
    queue = open_queue(config.queue, policy.audit.path, config.proxy.queue_size,
                       max([config.judge.timeout_s, *budgets]), call_timeout_s, policy.audit.synchronous)
    cache = DetectionCache(config.queue.url, config.queue.cache_ttl_s, config.queue.fleet_key, call_timeout_s) \
        if config.queue.url and config.queue.fleet_key and config.queue.cache_ttl_s else None
    shared = queue if isinstance(queue, RedisCheckQueue) else None
    checker = Checker(detector, engine, config, cache, shared if config.proxy.inline_via == "workers" else None)
    return Guard(checker, engine, config, audit, Escalator(policy.escalation, audit), queue, shared)

