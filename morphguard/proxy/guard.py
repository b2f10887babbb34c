"""Reviews an answer for the proxy: check it (within the profile's latency budget), let policy decide,
carry out the action (re-asking the upstream for `regenerate`), then audit and escalate.

Inline, or through the durable check queue (async mode), where the answer has already left and only
annotating, auditing and escalating remain possible. Every request the proxy accepted ends as exactly
one audit row: checked, or not checked with a short reason code (`no_context`, `queue_full`,
`queue_unavailable`, `upstream_timeout`, ...). The row is keyed by request id (a second write of it
changes nothing) and carries its escalation's outbox row in the same transaction; the escalation is
sent only once both are committed.

While the store is unreachable, a queued check keeps its queue entry (unacknowledged, its claim renewed)
and its row is written again with backoff until the store takes it; a row a client would wait for is
written from the background instead, so the answer goes out. A row the database refuses is written
without its texts and counted (`audit_failures`, in /readyz and a metric), never skipped silently.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

from opentelemetry import trace
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, stop_never, wait_exponential_jitter

from morphguard import telemetry
from morphguard.config import Config
from morphguard.detectors import Detector, build_detector, fingerprint
from morphguard.errors import LLMError, LLMTimeoutError, MorphguardError
from morphguard.models import Detection, utf8
from morphguard.policy import actions, answers
from morphguard.policy.audit import AuditStore, Written
from morphguard.policy.audit_writer import AuditWriter
from morphguard.policy.engine import PolicyEngine
from morphguard.policy.record import DecisionRecord
from morphguard.proxy.check import CheckOutcome, CheckRequest
from morphguard.proxy.errors import mask_secrets
from morphguard.proxy.escalation import Escalator
from morphguard.proxy.journal import Journal
from morphguard.proxy.outage import Outage
from morphguard.store import verdicts
from morphguard.store.queue import CheckQueue, Entry, QueueUnavailable, open_queue
from morphguard.store.redis_queue import RedisCheckQueue
from morphguard.store.verdicts import VerdictCache
from morphguard.telemetry import names

log = logging.getLogger(__name__)

Reask = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
_CHANGES_CONTENT = {"highlight", "cite", "regenerate", "block"}
# Reasons for not checking that are policy working as configured; every other reason is also an error metric.
_ROUTINE = frozenset({"no_context", "unchecked_route"})


class Guard:
    def __init__(self, detector: Detector, engine: PolicyEngine, config: Config,
                 audit: AuditStore | None, escalator: Escalator, queue: CheckQueue,
                 cache: VerdictCache | None = None, pool: RedisCheckQueue | None = None) -> None:
        self.detector = detector
        self._named: dict[str, Detector] = {}
        self.engine = engine
        self.config = config
        self.settings = config.proxy
        self.audit = audit
        self._rows = AuditWriter(audit, escalator.owner) if audit is not None else None
        self.escalator = escalator
        self.queue = queue
        self.cache = cache
        self.pool = pool  # the worker pool inline checks go to (`proxy.inline_via: workers`), and replies go back by
        self._fingerprints: dict[str, str] = {}
        self._workers: list[asyncio.Task[None]] = []
        self._busy = 0  # queue entries this process has taken and not finished
        self._background: set[asyncio.Task[Any]] = set()  # rows written later: a cancelled stream, a store away
        self.audit_failures = 0
        telemetry.labels.configure(config)  # the metrics this guard emits carry labels from this config only
        self._store = Outage("audit store", log)
        self._queue = Outage("async check queue", log)
        self._queue_full = Outage("room in the async check queue", log)
        # What this process queued on Redis, until recorded: queued again if Redis comes back without it.
        self._journal = Journal() if pool is not None and audit is not None else None

    def answer_text(self, completion: dict[str, Any]) -> str:
        """What the check reads of a completion, as policy says (`policy.tool_calls`)."""
        return answers.checked_text(completion, tool_calls=self.config.policy.tool_calls == "check")

    def _unread(self, completion: dict[str, Any]) -> str | None:
        """A note of what the check did not read, for the audit row; None when it read everything."""
        parts = answers.unreadable(completion)
        if parts:
            return "unreadable_output: " + ", ".join(sorted(set(parts)))
        if self.config.policy.tool_calls == "record" and answers.has_tool_calls(completion):
            return "tool_calls_unchecked"
        return None

    async def check(self, request: CheckRequest, completion: dict[str, Any]) -> CheckOutcome:
        """The check of what the completion says, noting what it could not read (`policy.tool_calls`,
        `policy.unreadable_output`), and blocking it where policy says so."""
        started = time.perf_counter()
        outcome = await self._check(request, completion)
        unread = self._unread(completion) if request.rag is not None else None
        if unread is None:
            return outcome
        decision = outcome.decision
        if unread.startswith("unreadable_output") and self.config.policy.unreadable_output == "block":
            decision = decision.model_copy(update={"action": "block", "escalate": False})
        note = f"{decision.reason}; {unread}" if decision.reason else unread
        return CheckOutcome(decision.model_copy(update={"reason": note}), outcome.detection,
                            outcome.latency_ms or (time.perf_counter() - started) * 1000)

    async def _check(self, request: CheckRequest, completion: dict[str, Any]) -> CheckOutcome:
        started = time.perf_counter()
        answer = self.answer_text(completion)
        if request.rag is None:
            return CheckOutcome(self.engine.unchecked(request.profile, request.topic, "no_context"), None, 0.0)
        if not answer.strip():
            return CheckOutcome(self.engine.unchecked(request.profile, request.topic, "no_answer"), None, 0.0)
        budget = self.engine.budget_s(request.profile)
        try:
            if self.pool is not None and self.settings.inline_via == "workers":
                detection = await self._detect_by_workers(request, utf8(answer), budget)
            else:
                detector = await self.detector_for(request.detector)
                detection = await asyncio.wait_for(self._detect(detector, request, utf8(answer)), budget)
        except (MorphguardError, TimeoutError) as exc:
            # Clients and the audit get a short stable code; the exception chain stays in the log and span.
            reason = ("latency_budget_exceeded" if isinstance(exc, TimeoutError)
                      else "judge_timeout" if isinstance(exc, LLMTimeoutError) else "judge_error")
            _record_masked(exc)
            telemetry.count_error(reason)  # whether policy then fails open or closed: the judge failed either way
            decision = self.engine.failed(request.profile, request.topic, reason)
            log.warning("request %s %s unchecked (%s): %s", request.request_id,
                        "passed" if decision.action == "pass" else "blocked", decision.reason, exc)
            return CheckOutcome(decision, None, (time.perf_counter() - started) * 1000)
        decision = self.engine.decide(request.profile, request.topic, detection)
        return CheckOutcome(decision, detection, (time.perf_counter() - started) * 1000)

    async def _detect(self, detector: Detector, request: CheckRequest, answer: str) -> Detection:
        assert request.rag is not None
        if self.cache is None:
            return await detector.detect(request.rag, answer)
        name = request.detector or self.config.detector.name
        if name not in self._fingerprints:
            self._fingerprints[name] = fingerprint(self.config, name)
        key = verdicts.key_of(self._fingerprints[name], request.rag.question, request.rag.passages, answer)
        cached = await self.cache.get(key)
        if cached is not None:
            return Detection.model_validate(cached)
        detection = await detector.detect(request.rag, answer)
        await self.cache.put(key, detection.model_dump(mode="json"))
        return detection

    async def _detect_by_workers(self, request: CheckRequest, answer: str, budget: float | None) -> Detection:
        """The detection, computed by whichever worker takes the job; failures raise as a local check's would."""
        assert self.pool is not None
        job = {"detect": {"request": request.to_dict(), "answer": answer, "trace": telemetry.carrier()}}
        reply = await self.pool.call(request.request_id, job, budget or self.config.judge.timeout_s)
        if reply is None:
            raise TimeoutError("no worker answered within the latency budget")
        error = reply.get("error")
        if error == "judge_timeout":
            raise LLMTimeoutError("the worker's judge timed out")
        if error:
            raise LLMError(f"the worker could not check: {error}")
        return Detection.model_validate(reply["detection"])

    async def _detect_for_caller(self, entry: Entry) -> dict[str, Any]:
        """A worker's half of `_detect_by_workers`: the detection or a short error, never an exception."""
        job = entry.payload["detect"]
        request = CheckRequest.from_dict(job["request"])
        if entry.poisoned:
            return {"error": "check_crashed"}
        remaining = entry.payload["deadline"] - time.time()
        if remaining <= 0:
            return {"error": "expired"}  # the caller has given up waiting: spend no judge time on it
        with telemetry.continued(job.get("trace"), names.SPAN_REMOTE_CHECK, request.request_id):
            try:
                detector = await self.detector_for(request.detector)
                detection = await asyncio.wait_for(self._detect(detector, request, job["answer"]), remaining)
            except (MorphguardError, TimeoutError) as exc:
                _record_masked(exc)
                return {"error": "judge_timeout" if isinstance(exc, LLMTimeoutError | TimeoutError) else "judge_error"}
        return {"detection": detection.model_dump(mode="json")}

    async def detector_for(self, name: str | None) -> Detector:
        """The configured detector, or one a request names, built once and sharing the judge client."""
        if not name or name == self.detector.name:
            return self.detector
        if name not in self._named:
            llm = getattr(self.detector, "llm", None)
            self._named[name] = await asyncio.to_thread(build_detector, self.config, llm, name)
        return self._named[name]

    async def settle(self, request: CheckRequest, completion: dict[str, Any], *, can_change: bool = True,
                     reask: Reask | None = None, mode: str = "inline",
                     wait_for_store: bool = False) -> tuple[dict[str, Any], DecisionRecord]:
        """The completion as the client gets it, and the record of the decision.

        Inline, the check's span is a child of the chat span and the evaluation event goes on the chat span;
        async, the check is the root of its own trace, linked to the chat span. `wait_for_store`: return only
        once the record is committed (a worker acknowledges its queue entry after that).
        """
        link = request.chat_span.get_span_context() if mode == "async" and request.chat_span else None
        with telemetry.guardrail_span(request.request_id, mode, link_to=link) as span:
            result = await self.check(request, completion)
            attempts = 0
            if result.decision.action == "regenerate" and can_change and reask is None:
                # This API offers no way to ask again (Responses, Messages): the safe fallback is to withhold.
                note = "regenerate not possible on this API: blocked"
                result = CheckOutcome(result.decision.model_copy(update={"action": "block", "reason": note}),
                                      result.detection, result.latency_ms)
            if result.decision.action == "regenerate" and can_change and reask is not None:
                completion, result, attempts = await self._regenerate(request, completion, result, reask)
                if attempts:  # the action taken was a regeneration, whatever the final answer scored
                    result = CheckOutcome(result.decision.model_copy(update={"action": "regenerate"}), result.detection,
                                     result.latency_ms)
            decision = result.decision
            if not can_change and decision.action in _CHANGES_CONTENT:
                note = f"{decision.action} not possible: the answer was already sent"
                decision = decision.model_copy(update={"action": "annotate", "reason": note})
                result = CheckOutcome(decision, result.detection, result.latency_ms)
            checked_answer = self.answer_text(completion)  # the audit keeps what the model said, not our rewrite
            if decision.action != "regenerate":
                passages = request.rag.passages if request.rag else []
                # pure Python over the answer and the context (`cite` looks up sources): off the event loop
                completion = await asyncio.to_thread(actions.apply, completion, decision, result.detection, passages,
                                                     self.config.policy)
            chat = request.chat_span
            evaluated = chat if chat is not None and chat.is_recording() else span
            telemetry.record_check(span, evaluated, decision=decision, detection=result.detection,
                                   question=request.rag.question if request.rag else None,
                                   context=request.rag.passages if request.rag else None, answer=checked_answer)
            record = result.record(request, answer=checked_answer, regenerations=attempts,
                                   trace_id=telemetry.trace_id(span))
        await self._record(record, wait_for_store)
        return completion, record

    async def _regenerate(self, request: CheckRequest, completion: dict[str, Any], first: CheckOutcome,
                          reask: Reask) -> tuple[dict[str, Any], CheckOutcome, int]:
        """Re-ask with the unsupported claims named, re-check, keep the best; stop once an answer passes."""
        best, best_result, attempts = completion, first, 0
        latest = first
        for _ in range(self.config.policy.regenerate.max_attempts):
            if latest.detection is None:
                break
            body = actions.regeneration_body(request.body, latest.detection, latest.decision.threshold,
                                             self.config.policy)
            try:
                candidate = await reask(body)
            except Exception as exc:  # the upstream failed on the re-ask: keep what we have
                log.warning("request %s: regeneration failed: %s", request.request_id, exc)
                break
            attempts += 1
            latest = await self.check(request, candidate)
            if latest.detection is not None and (best_result.detection is None
                                                 or latest.detection.score < best_result.detection.score):
                best, best_result = candidate, latest
            if not latest.decision.flagged and latest.detection is not None:
                break
        return best, best_result, attempts

    async def _record(self, record: DecisionRecord, wait_for_store: bool = False) -> None:
        """The audit row (with its escalation's outbox row), then the escalation.

        If the store cannot be reached: `wait_for_store` waits, retrying, until it can; otherwise the row is
        written from the background, so that a client is not held up by an outage.
        """
        if self._rows is None:
            if record.escalated:
                self.escalator.submit(record.escalation())
            return
        if wait_for_store:
            await self._write(record, retry=True)
            return
        try:
            await self._write(record, retry=False)
        except Exception:  # unreachable (a refused row is handled in _write): keep trying, off the request
            self._in_background(self._write(record, retry=True))

    async def _write(self, record: DecisionRecord, retry: bool) -> None:
        """Commit the row, and send its escalation once committed; a row the database refuses is written
        again without its texts. Raises only when the store is unreachable and not `retry`."""
        try:
            written = await self._commit(record, retry)
        except Exception as exc:
            assert self.audit is not None
            if self.audit.unavailable(exc):
                raise
            log.error("request %s: audit record failed (%s); recording it without its texts", record.request_id,
                      exc)
            self.audit_failures += 1
            telemetry.count_error("audit_failed")
            record = record.model_copy(update={"question": None, "answer": None, "context": None, "factoids": [],
                                               "reason": f"{record.reason or ''} audit_failed".strip()})
            try:
                written = await self._commit(record, retry)
            except Exception:
                log.exception("request %s: audit trail unavailable", record.request_id)
                return
        if written.outbox_id is not None:
            self.escalator.submit(record.escalation(), written.outbox_id)

    async def _commit(self, record: DecisionRecord, retry: bool) -> Written:
        """One commit through the writer; while the store is unreachable, again with backoff if `retry`."""
        assert self._rows is not None and self.audit is not None
        rows, audit = self._rows, self.audit
        async for attempt in AsyncRetrying(retry=retry_if_exception(audit.unavailable),
                                           stop=stop_never if retry else stop_after_attempt(1),
                                           wait=wait_exponential_jitter(initial=0.2, max=5.0), reraise=True):
            with attempt:
                try:
                    written = await rows.write(record)
                except Exception as exc:
                    if audit.unavailable(exc):
                        self._store.failed(exc)
                    raise
        self._store.ok()
        return written

    def _in_background(self, work: Awaitable[Any]) -> None:
        """Work that must end in a record though nobody awaits it; stop() gives it the grace period."""
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def account(self, request: CheckRequest, reason: str, answer: str | None = None, *,
                      wait_for_store: bool = False) -> DecisionRecord:
        """Record a request that ends without a check (an upstream failure, no context, a full queue)."""
        result = CheckOutcome(self.engine.unchecked(request.profile, request.topic, reason), None, 0.0)
        with telemetry.guardrail_span(request.request_id, "inline") as span:
            telemetry.record_check(span, span, decision=result.decision, detection=None)
            record = result.record(request, answer=answer or "", trace_id=telemetry.trace_id(span))
        if reason not in _ROUTINE:
            telemetry.count_error(reason)
        await self._record(record, wait_for_store)
        return record

    def account_soon(self, request: CheckRequest, reason: str, answer: str | None = None) -> None:
        """`account` from where awaiting is no longer possible (a cancelled stream); done before shutdown."""
        self._in_background(self.account(request, reason, answer))

    async def check_later(self, request: CheckRequest, completion: dict[str, Any]) -> DecisionRecord | None:
        """Queue a check durably; the record to send now, or None when the caller must check inline.

        A queue that is full, or cannot be reached, gets `proxy.on_queue_full`: check inline, or record the
        request as not checked. While the queue is known to be away no put is tried: the observer finds
        it back.
        """
        if request.rag is None:
            return await self.account(request, "no_context", self.answer_text(completion))
        payload = {"request": request.to_dict(), "completion": completion}
        reason = "queue_unavailable"
        if not self._queue.down:
            try:
                stored = await self.queue.put(request.request_id, payload)
            except QueueUnavailable as exc:
                self._queue.failed(exc)
            else:
                self._queue.ok()
                if stored:
                    self._queue_full.ok()
                    if self._journal is not None:
                        assert self.pool is not None
                        self._journal.add(request.request_id, payload, self.pool.epoch)
                    return request.pending("queued")
                reason = "queue_full"
                self._queue_full.failed(RuntimeError(f"{self.settings.queue_size} checks waiting"))
        if self.settings.on_queue_full == "inline":
            return None
        return await self.account(request, reason, self.answer_text(completion))

    async def start(self) -> None:
        try:
            waiting = await self.queue.recover()
        except QueueUnavailable as exc:  # the consumers and the observer keep trying
            self._queue.failed(exc)
            waiting = 0
        if waiting and self.settings.workers:
            log.info("%d async checks waiting in the queue", waiting)
        resumed = await self.escalator.resume()
        if resumed:
            log.info("resuming %d escalations left undelivered", resumed)
        self._workers = [asyncio.create_task(self._work()) for _ in range(self.settings.workers)]
        self._workers.append(asyncio.create_task(self._observe_queue()))
        if self._journal is not None:
            self._workers.append(asyncio.create_task(self._requeue_lost()))

    async def _observe_queue(self) -> None:
        """The queue's gauges, refreshed for the metric reader (its callbacks cannot await); the claims of the
        entries being worked on renewed; the queue's and the store's outages noticed, and their ends."""
        while True:
            try:
                stats = await self.queue.stats()
                await self.queue.keep_claims()
            except QueueUnavailable as exc:  # reported by /readyz; the gauges keep their last values
                self._queue.failed(exc)
            except Exception as exc:
                log.debug("queue stats unavailable: %s", exc)
            else:
                self._queue.ok()
                if self.audit is not None:
                    stats["escalation_backlog"] = await self._escalations_waiting()
                telemetry.queue_observed(stats)
            await asyncio.sleep(2.0)

    async def _escalations_waiting(self) -> int:
        assert self.audit is not None
        try:
            return await asyncio.to_thread(self.audit.escalation_backlog)
        except Exception:  # the store is away: its outage is logged where rows are written
            return 0

    def escalation_backlog(self) -> dict[str, int]:
        """Escalations waiting for the webhook: pending (being tried) and undelivered (tried again later).
        Blocking: call it off the loop."""
        if self.audit is None:
            return {}
        states = self.audit.escalation_states()
        return {"pending": states.get("pending", 0), "undelivered": states.get("undelivered", 0),
                "retrying": self.audit.escalation_backlog() - states.get("pending", 0)}

    async def _requeue_lost(self) -> None:
        """Every 2 s: forget what is recorded; queue again what Redis lost (it came back without its data)."""
        assert self._journal is not None and self.pool is not None and self.audit is not None
        journal, pool, audit = self._journal, self.pool, self.audit
        while True:
            await asyncio.sleep(2.0)
            if not len(journal):
                continue
            try:
                epoch = await pool.current_epoch()
                journal.forget(await asyncio.to_thread(audit.recorded, journal.older_than(2.0)))
                lost = journal.lost(epoch)
                if lost:
                    journal.forget(await asyncio.to_thread(audit.recorded, [key for key, _ in lost]))
                    await self._requeue(journal.lost(epoch))
            except Exception as exc:  # the queue or the store is away: the next round tries again
                log.debug("cannot reconcile queued checks now: %s", exc)

    async def _requeue(self, lost: list[tuple[str, dict[str, Any]]]) -> None:
        assert self._journal is not None and self.pool is not None
        log.warning("Redis lost %d queued checks (it restarted without its data): queueing them again", len(lost))
        for key, payload in lost:
            # tries=1: the worker first looks whether a worker recorded it before Redis lost it
            if await self.pool.put(key, payload, tries=1):
                self._journal.add(key, payload, self.pool.epoch)

    async def _work(self) -> None:
        pause = 0.5
        while True:
            try:
                await self._consume()
            except asyncio.CancelledError:
                raise
            except QueueUnavailable as exc:  # Redis away: one log line for the outage, not one per try
                self._queue.failed(exc)
                await asyncio.sleep(pause)
                pause = min(pause * 2, 5.0)
            except Exception:  # a bug, or the queue failed in a way we do not know: keep the worker alive
                log.exception("async check queue failed; retrying")
                await asyncio.sleep(1.0)

    async def _consume(self) -> None:
        while True:
            entry = await self.queue.take(wait_s=1.0)
            self._queue.ok()
            if entry is not None:
                self._busy += 1
                try:
                    await self._finish(entry)
                finally:
                    self._busy -= 1

    async def _finish(self, entry: Entry) -> None:
        if "detect" in entry.payload and self.pool is not None:  # an inline check a proxy waits for
            await self.pool.answer(entry, await self._detect_for_caller(entry))
            return
        request = CheckRequest.from_dict(entry.payload["request"])
        completion = entry.payload["completion"]
        if entry.tries and await self._recorded(request.request_id):
            log.info("async check of %s: recorded on an earlier delivery", request.request_id)
            await self._acknowledge(self.queue.done, entry)
            return
        try:
            if entry.poisoned:
                await self.account(request, "check_crashed", self.answer_text(completion), wait_for_store=True)
                await self._acknowledge(self.queue.dead, entry, "check_crashed")
                return
            _, record = await self.settle(request, completion, can_change=False, mode="async", wait_for_store=True)
            log.info("async check of %s: score %s, flagged %s, action %s", record.request_id,
                     record.score, record.flagged, record.action)
        except Exception:
            log.exception("async check of %s crashed (try %d)", request.request_id, entry.tries + 1)
            await self.queue.retry(entry)
            return
        await self._acknowledge(self.queue.done, entry)

    async def _recorded(self, request_id: str) -> bool:
        if self.audit is None:
            return False
        try:
            return request_id in await asyncio.to_thread(self.audit.recorded, [request_id])
        except Exception:  # the store is away: check again; the write will wait for it and change nothing
            return False

    async def _acknowledge(self, how: Callable[..., Awaitable[None]], entry: Entry, *args: Any) -> None:
        """Acknowledge an entry whose record is written, however long the queue is away: not acknowledged, it
        would be checked again."""
        async for attempt in AsyncRetrying(retry=retry_if_exception(lambda e: isinstance(e, QueueUnavailable)),
                                           wait=wait_exponential_jitter(initial=0.2, max=5.0), reraise=True):
            with attempt:
                try:
                    await how(entry, *args)
                except QueueUnavailable as exc:
                    self._queue.failed(exc)
                    raise
        self._queue.ok()

    async def stop(self) -> None:
        """Finish what is under way within the grace period; what is left stays queued.

        On its own queue this process also works the backlog down first; on a shared queue other workers
        take what is waiting, and only this process's claimed checks are its to finish.
        """
        grace = self.settings.shutdown_grace_s
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and (self._busy or (self._workers_consume_local()
                                                              and await self.queue.backlog() > 0)):
            await asyncio.sleep(0.1)
        if self._background:
            await asyncio.wait(list(self._background), timeout=max(1.0, deadline - time.monotonic()))
        if self._background:
            log.error("shutdown: %d audit rows not written (the audit store is unreachable)", len(self._background))
            for task in list(self._background):
                task.cancel()
        for worker in self._workers:
            worker.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        if not self.queue.shared:
            left = await self.queue.backlog()
            if left:
                log.warning("shutdown: %d async checks left queued for the next start", left)
        await self.escalator.aclose(max(0.0, deadline - time.monotonic()))

    async def close(self) -> None:
        await self.queue.close()
        if self.cache is not None:
            await self.cache.close()
        if self._rows is not None:
            await asyncio.to_thread(self._rows.close)
        if self.audit is not None:
            await asyncio.to_thread(self.audit.close)

    def _workers_consume_local(self) -> bool:
        return not self.queue.shared and self.settings.workers > 0


def build_guard(config: Config, detector: Detector, engine: PolicyEngine) -> Guard:
    """A guard on the configured stores: the audit trail, the escalation outbox, the check queue and,
    for a fleet, the shared verdict cache. Blocking (it connects and migrates): call it off the loop."""
    policy = config.policy
    audit = AuditStore(policy.audit, config.store) if policy.audit.enabled else None
    budgets = [p.latency_budget_s or 0.0 for p in policy.profiles.values()]
    queue = open_queue(config.queue, policy.audit.path, config.proxy.queue_size,
                       max([config.judge.timeout_s, *budgets]))
    cache = VerdictCache(config.queue.url, config.queue.cache_ttl_s) \
        if config.queue.url and config.queue.cache_ttl_s else None
    pool = queue if isinstance(queue, RedisCheckQueue) else None
    return Guard(detector, engine, config, audit, Escalator(policy.escalation, audit), queue, cache, pool)


def _record_masked(exc: BaseException) -> None:
    """The judge's error on the current span, with any secret it echoes masked (litellm's messages may)."""
    trace.get_current_span().record_exception(exc, attributes={
        "exception.message": mask_secrets(str(exc)),
        "exception.stacktrace": mask_secrets("".join(traceback.format_exception(exc)))})
