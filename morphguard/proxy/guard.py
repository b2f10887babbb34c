"""Reviews an answer for the proxy: check it (within the profile's latency budget), let policy decide,
carry out the action (re-asking the upstream for `regenerate`), then audit and escalate.

Inline, or through the durable check queue (async mode), where the answer has already left and only
annotating, auditing and escalating remain possible. Every request the proxy accepted ends as exactly
one audit row: checked, or not checked with a short reason code (`no_context`, `queue_full`,
`upstream_timeout`, ...). A row that cannot be written is counted (`audit_failures`, in /readyz and a
metric) and logged, never skipped silently.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

from opentelemetry import trace

from morphguard import telemetry
from morphguard.config import Config
from morphguard.detectors import Detector, build_detector, fingerprint
from morphguard.errors import LLMError, LLMTimeoutError, MorphguardError
from morphguard.models import Detection, utf8
from morphguard.policy import actions, answers
from morphguard.policy.audit import AuditStore
from morphguard.policy.audit_writer import AuditWriter
from morphguard.policy.engine import PolicyEngine
from morphguard.policy.record import DecisionRecord
from morphguard.proxy.check import CheckOutcome, CheckRequest
from morphguard.proxy.errors import mask_secrets
from morphguard.proxy.escalation import Escalator
from morphguard.store import verdicts
from morphguard.store.queue import CheckQueue, Entry, open_queue
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
        self._rows = AuditWriter(audit) if audit is not None else None
        self.escalator = escalator
        self.queue = queue
        self.cache = cache
        self.pool = pool  # the worker pool inline checks go to (`proxy.inline_via: workers`), and replies go back by
        self._fingerprints: dict[str, str] = {}
        self._workers: list[asyncio.Task[None]] = []
        self._busy = 0  # queue entries this process has taken and not finished
        self._accounting: set[asyncio.Task[DecisionRecord]] = set()
        self.audit_failures = 0
        telemetry.labels.configure(config)  # the metrics this guard emits carry labels from this config only

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

    async def review(self, request: CheckRequest, completion: dict[str, Any], *, can_change: bool = True,
                     reask: Reask | None = None, mode: str = "inline") -> tuple[dict[str, Any], DecisionRecord]:
        """The completion as the client gets it, and the record of the decision.

        Inline, the check's span is a child of the chat span and the evaluation event goes on the chat span;
        async, the check is the root of its own trace, linked to the chat span.
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
        await self._record(record)
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

    async def _record(self, record: DecisionRecord) -> None:
        await self._write(record)
        if record.escalated:
            await self.escalator.submit(record.escalation())

    async def _write(self, record: DecisionRecord) -> None:
        """One audit row; if it cannot be written, a row without the texts, and the failure counted."""
        if self._rows is None:
            return
        try:
            await self._rows.write(record)
            return
        except Exception:
            log.exception("request %s: audit record failed; recording it without its texts", record.request_id)
        self.audit_failures += 1
        telemetry.count_error("audit_failed")
        bare = record.model_copy(update={"question": None, "answer": None, "context": None, "factoids": [],
                                         "reason": f"{record.reason or ''} audit_failed".strip()})
        try:
            await self._rows.write(bare)
        except Exception:
            log.exception("request %s: audit trail unavailable", record.request_id)

    async def account(self, request: CheckRequest, reason: str, answer: str | None = None) -> DecisionRecord:
        """Record a request that ends without a check (an upstream failure, no context, a full queue)."""
        result = CheckOutcome(self.engine.unchecked(request.profile, request.topic, reason), None, 0.0)
        with telemetry.guardrail_span(request.request_id, "inline") as span:
            telemetry.record_check(span, span, decision=result.decision, detection=None)
            record = result.record(request, answer=answer or "", trace_id=telemetry.trace_id(span))
        if reason not in _ROUTINE:
            telemetry.count_error(reason)
        await self._record(record)
        return record

    def account_soon(self, request: CheckRequest, reason: str, answer: str | None = None) -> None:
        """`account` from where awaiting is no longer possible (a cancelled stream); done before shutdown."""
        task = asyncio.create_task(self.account(request, reason, answer))
        self._accounting.add(task)
        task.add_done_callback(self._accounting.discard)

    async def check_later(self, request: CheckRequest, completion: dict[str, Any]) -> DecisionRecord | None:
        """Queue a check durably; the record to send now, or None when the caller must check inline."""
        if request.rag is None:
            return await self.account(request, "no_context", self.answer_text(completion))
        stored = await self.queue.put(request.request_id, {"request": request.to_dict(), "completion": completion})
        if not stored:
            if self.settings.on_queue_full == "inline":
                return None
            log.warning("async check queue full (%d): request %s recorded as not checked",
                        self.settings.queue_size, request.request_id)
            return await self.account(request, "queue_full", self.answer_text(completion))
        return request.pending("queued")

    async def start(self) -> None:
        waiting = await self.queue.recover()
        if waiting and self.settings.workers:
            log.info("%d async checks waiting in the queue", waiting)
        resumed = await self.escalator.resume()
        if resumed:
            log.info("resuming %d escalations left undelivered", resumed)
        self._workers = [asyncio.create_task(self._work()) for _ in range(self.settings.workers)]
        self._workers.append(asyncio.create_task(self._observe_queue()))

    async def _observe_queue(self) -> None:
        """The queue's gauges, refreshed for the metric reader (its callbacks cannot await)."""
        while True:
            try:
                telemetry.queue_observed(await self.queue.stats())
            except Exception as exc:  # reported by /readyz; the gauges keep their last values
                log.debug("queue stats unavailable: %s", exc)
            await asyncio.sleep(2.0)

    async def _work(self) -> None:
        while True:
            try:
                await self._consume()
            except asyncio.CancelledError:
                raise
            except Exception:  # the queue itself failed (a locked database, Redis away): keep the worker alive
                log.exception("async check queue unavailable; retrying")
                await asyncio.sleep(1.0)

    async def _consume(self) -> None:
        while True:
            entry = await self.queue.take(wait_s=1.0)
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
        try:
            if entry.poisoned:
                await self.account(request, "check_crashed", self.answer_text(completion))
                await self.queue.dead(entry, "check_crashed")
                return
            _, record = await self.review(request, completion, can_change=False, mode="async")
            log.info("async check of %s: score %s, flagged %s, action %s", record.request_id,
                     record.score, record.flagged, record.action)
        except Exception:
            log.exception("async check of %s crashed (try %d)", request.request_id, entry.tries + 1)
            await self.queue.retry(entry)
            return
        await self.queue.done(entry)

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
        if self._accounting:
            await asyncio.wait(list(self._accounting), timeout=max(1.0, deadline - time.monotonic()))
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
