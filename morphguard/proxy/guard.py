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
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, TraceFlags

from morphguard import telemetry
from morphguard.config import Config
from morphguard.detectors import Detector, build_detector
from morphguard.errors import LLMTimeoutError, MorphguardError
from morphguard.models import Decision, Detection, RagInput, utf8
from morphguard.policy import actions
from morphguard.policy.audit import AuditStore, now
from morphguard.policy.engine import PolicyEngine
from morphguard.proxy import verdict as v
from morphguard.proxy.escalation import Escalator
from morphguard.store.queue import CheckQueue

log = logging.getLogger(__name__)

Reask = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
_CHANGES_CONTENT = {"highlight", "cite", "regenerate", "block"}


@dataclass
class Review:
    """One request as policy sees it."""

    body: dict[str, Any]  # the request as forwarded upstream
    rag: RagInput | None
    source: str | None
    profile: str
    topic: str
    model: str | None = None
    route: str = ""
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    chat_span: Span | None = None  # the upstream call's span, which the evaluation event goes on
    detector: str | None = None  # named by the request (morphguard.detector); None: the configured one

    def to_dict(self) -> dict[str, Any]:
        """What the durable queue keeps; the chat span survives as the context a check links to."""
        link = self.chat_span.get_span_context() if self.chat_span is not None else None
        return {"body": self.body, "rag": self.rag.model_dump() if self.rag else None, "source": self.source,
                "profile": self.profile, "topic": self.topic, "model": self.model, "route": self.route,
                "request_id": self.request_id, "detector": self.detector,
                "link": [link.trace_id, link.span_id] if link is not None and link.is_valid else None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Review:
        link = data.get("link")
        span = NonRecordingSpan(SpanContext(link[0], link[1], is_remote=True, trace_flags=TraceFlags(1))) \
            if link else None
        rag = RagInput.model_validate(data["rag"]) if data.get("rag") else None
        return cls(body=data["body"], rag=rag, source=data.get("source"), profile=data["profile"],
                   topic=data["topic"], model=data.get("model"), route=data.get("route") or "",
                   request_id=data["request_id"], chat_span=span, detector=data.get("detector"))


@dataclass
class Checked:
    decision: Decision
    detection: Detection | None
    latency_ms: float


class Guard:
    def __init__(self, detector: Detector, engine: PolicyEngine, config: Config,
                 audit: AuditStore | None, escalator: Escalator, queue: CheckQueue) -> None:
        self.detector = detector
        self._named: dict[str, Detector] = {}
        self.engine = engine
        self.config = config
        self.settings = config.proxy
        self.audit = audit
        self.escalator = escalator
        self.queue = queue
        self._wake = asyncio.Event()
        self._workers: list[asyncio.Task[None]] = []
        self.audit_failures = 0

    async def check(self, review: Review, answer: str) -> Checked:
        started = time.perf_counter()
        if review.rag is None:
            return Checked(self.engine.unchecked(review.profile, review.topic, "no_context"), None, 0.0)
        if not answer.strip():
            return Checked(self.engine.unchecked(review.profile, review.topic, "no_answer"), None, 0.0)
        budget = self.engine.budget_s(review.profile)
        try:
            detector = await self.detector_for(review.detector)
            detection = await asyncio.wait_for(detector.detect(review.rag, utf8(answer)), budget)
        except (MorphguardError, TimeoutError) as exc:
            # Clients and the audit get a short stable code; the exception chain stays in the log and span.
            reason = ("latency_budget_exceeded" if isinstance(exc, TimeoutError)
                      else "judge_timeout" if isinstance(exc, LLMTimeoutError) else "judge_error")
            trace.get_current_span().record_exception(exc)
            decision = self.engine.failed(review.profile, review.topic, reason)
            log.warning("request %s %s unchecked (%s): %s", review.request_id,
                        "passed" if decision.action == "pass" else "blocked", decision.reason, exc)
            return Checked(decision, None, (time.perf_counter() - started) * 1000)
        decision = self.engine.decide(review.profile, review.topic, detection)
        return Checked(decision, detection, (time.perf_counter() - started) * 1000)

    async def detector_for(self, name: str | None) -> Detector:
        """The configured detector, or one a request names, built once and sharing the judge client."""
        if not name or name == self.detector.name:
            return self.detector
        if name not in self._named:
            llm = getattr(self.detector, "llm", None)
            self._named[name] = await asyncio.to_thread(build_detector, self.config, llm, name)
        return self._named[name]

    async def review(self, review: Review, completion: dict[str, Any], *, can_change: bool = True,
                     reask: Reask | None = None, mode: str = "inline") -> tuple[dict[str, Any], dict[str, Any]]:
        """The completion as the client gets it, and the verdict to attach.

        Inline, the check's span is a child of the chat span and the evaluation event goes on the chat span;
        async, the check is the root of its own trace, linked to the chat span.
        """
        link = review.chat_span.get_span_context() if mode == "async" and review.chat_span else None
        with telemetry.guardrail_span(review.request_id, mode, link_to=link) as span:
            result = await self.check(review, actions.answer_of(completion))
            attempts = 0
            if result.decision.action == "regenerate" and can_change and reask is not None:
                completion, result, attempts = await self._regenerate(review, completion, result, reask)
                if attempts:  # the action taken was a regeneration, whatever the final answer scored
                    result = Checked(result.decision.model_copy(update={"action": "regenerate"}), result.detection,
                                     result.latency_ms)
            decision = result.decision
            if not can_change and decision.action in _CHANGES_CONTENT:
                note = f"{decision.action} not possible: the answer was already sent"
                decision = decision.model_copy(update={"action": "annotate", "reason": note})
                result = Checked(decision, result.detection, result.latency_ms)
            checked_answer = actions.answer_of(completion)  # the audit keeps what the model said, not our rewrite
            if decision.action != "regenerate":
                passages = review.rag.passages if review.rag else []
                completion = actions.apply(completion, decision, result.detection, passages, self.config.policy)
            evaluated = review.chat_span if review.chat_span is not None and review.chat_span.is_recording() else span
            telemetry.record_check(span, evaluated, decision=decision, detection=result.detection,
                                   question=review.rag.question if review.rag else None,
                                   context=review.rag.passages if review.rag else None, answer=checked_answer)
            verdict = v.verdict(review, result, attempts, trace_id=telemetry.trace_id(span))
        await self._record(review, result, checked_answer, verdict)
        return completion, verdict

    async def _regenerate(self, review: Review, completion: dict[str, Any], first: Checked,
                          reask: Reask) -> tuple[dict[str, Any], Checked, int]:
        """Re-ask with the unsupported claims named, re-check, keep the best; stop once an answer passes."""
        best, best_result, attempts = completion, first, 0
        latest = first
        for _ in range(self.config.policy.regenerate.max_attempts):
            if latest.detection is None:
                break
            body = actions.regeneration_body(review.body, latest.detection, latest.decision.threshold,
                                             self.config.policy)
            try:
                candidate = await reask(body)
            except Exception as exc:  # the upstream failed on the re-ask: keep what we have
                log.warning("request %s: regeneration failed: %s", review.request_id, exc)
                break
            attempts += 1
            latest = await self.check(review, actions.answer_of(candidate))
            if latest.detection is not None and (best_result.detection is None
                                                 or latest.detection.score < best_result.detection.score):
                best, best_result = candidate, latest
            if not latest.decision.flagged and latest.detection is not None:
                break
        return best, best_result, attempts

    async def _record(self, review: Review, result: Checked, answer: str, verdict: dict[str, Any]) -> None:
        d, detection = result.decision, result.detection
        entry = {
            "time": now(), "request_id": review.request_id, "trace_id": verdict.get("trace_id"), "profile": d.profile,
            "route": review.route or None, "model": review.model, "topic": d.topic, "checked": detection is not None,
            "score": detection.score if detection else None, "threshold": d.threshold, "flagged": d.flagged,
            "action": d.action, "escalated": d.escalate, "reason": d.reason,
            "detector": detection.detector if detection else None,
            "factoids": verdict.get("factoids", []),
            "cost": detection.cost.model_dump(exclude={"stages"}) if detection else None,
            "question": review.rag.question if review.rag else None, "answer": answer,
            "context": "\n\n".join(review.rag.passages) if review.rag else None,
        }
        await self._write(entry)
        if d.escalate:
            await self.escalator.submit({k: entry[k] for k in entry if k not in ("question", "answer", "context")}
                                        | {"verdict": verdict})

    async def _write(self, entry: dict[str, Any]) -> None:
        """One audit row; if it cannot be written, a row without the texts, and the failure counted."""
        if self.audit is None:
            return
        try:
            await asyncio.to_thread(self.audit.record, entry)
            return
        except Exception:
            log.exception("request %s: audit record failed; recording it without its texts", entry["request_id"])
        self.audit_failures += 1
        telemetry.count_error("audit_failed")
        bare = {**entry, "question": None, "answer": None, "context": None, "factoids": [],
                "reason": f"{entry.get('reason') or ''} audit_failed".strip()}
        try:
            await asyncio.to_thread(self.audit.record, bare)
        except Exception:
            log.exception("request %s: audit trail unavailable", entry["request_id"])

    async def account(self, review: Review, reason: str, answer: str | None = None) -> dict[str, Any]:
        """Record a request that ends without a check (an upstream failure, no context, a full queue), and
        the verdict that says so."""
        result = Checked(self.engine.unchecked(review.profile, review.topic, reason), None, 0.0)
        with telemetry.guardrail_span(review.request_id, "inline") as span:
            telemetry.record_check(span, span, decision=result.decision, detection=None)
            verdict = v.verdict(review, result, trace_id=telemetry.trace_id(span))
        if reason.startswith("upstream") or reason.startswith("stream"):
            telemetry.count_error(reason)
        await self._record(review, result, answer or "", verdict)
        return verdict

    async def check_later(self, review: Review, completion: dict[str, Any]) -> dict[str, Any] | None:
        """Queue a review durably; the verdict to send now, or None when the caller must review inline."""
        if review.rag is None:
            await self.account(review, "no_context", actions.answer_of(completion))
            return v.pending(review, "no_context")
        stored = await asyncio.to_thread(self.queue.put, review.request_id,
                                         {"review": review.to_dict(), "completion": completion})
        if not stored:
            if self.settings.on_queue_full == "inline":
                return None
            log.warning("async check queue full (%d): request %s recorded as not checked",
                        self.settings.queue_size, review.request_id)
            await self.account(review, "queue_full", actions.answer_of(completion))
            return v.pending(review, "queue_full")
        telemetry.queue_changed(+1)
        self._wake.set()
        return v.pending(review, "queued")

    def start(self) -> None:
        waiting = self.queue.recover()
        if waiting:
            log.info("resuming %d async checks left by an earlier run", waiting)
            telemetry.queue_changed(waiting)
        resumed = self.escalator.resume()
        if resumed:
            log.info("resuming %d escalations left by an earlier run", resumed)
        self._workers = [asyncio.create_task(self._work()) for _ in range(self.settings.workers)]

    async def _work(self) -> None:
        while True:
            try:
                await self._consume()
            except asyncio.CancelledError:
                raise
            except Exception:  # the queue itself failed (a locked or broken database): keep the worker alive
                log.exception("async check queue unavailable; retrying")
                await asyncio.sleep(1.0)

    async def _consume(self) -> None:
        while True:
            entry = await asyncio.to_thread(self.queue.take)
            if entry is None:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=1.0)
                except TimeoutError:
                    pass
                continue
            review = Review.from_dict(entry.payload["review"])
            completion = entry.payload["completion"]
            try:
                if entry.poisoned:
                    await self.account(review, "check_crashed", actions.answer_of(completion))
                else:
                    _, verdict = await self.review(review, completion, can_change=False, mode="async")
                    log.info("async check: %s",
                             {k: verdict.get(k) for k in ("request_id", "score", "flagged", "action")})
            except Exception:
                log.exception("async check of %s crashed (try %d)", review.request_id, entry.tries + 1)
                await asyncio.to_thread(self.queue.retry, entry.id)
                continue
            await asyncio.to_thread(self.queue.done, entry.id)
            telemetry.queue_changed(-1)

    async def stop(self) -> None:
        """Let queued checks finish within the grace period; what is left stays queued for the next start."""
        grace = self.settings.shutdown_grace_s
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and await asyncio.to_thread(self.queue.pending) > 0:
            await asyncio.sleep(0.1)
        for worker in self._workers:
            worker.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        left = await asyncio.to_thread(self.queue.pending)
        if left:
            log.warning("shutdown: %d async checks left queued for the next start", left)
        await self.escalator.aclose(max(0.0, deadline - time.monotonic()))
