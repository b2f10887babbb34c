"""Reviews an answer for the proxy: check it (within the profile's latency budget), let policy decide,
carry out the action (re-asking the upstream for `regenerate`), then audit and escalate.

Inline, or on a bounded background queue with a worker pool (async mode), where the answer has already
left and only annotating, auditing and escalating remain possible.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.trace import Span

from morphguard import telemetry
from morphguard.config import Config
from morphguard.detectors import Detector, build_detector
from morphguard.errors import MorphguardError
from morphguard.models import Decision, Detection, RagInput
from morphguard.policy import actions
from morphguard.policy.audit import AuditStore, now
from morphguard.policy.engine import PolicyEngine
from morphguard.proxy import verdict as v
from morphguard.proxy.escalation import Escalator

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


@dataclass
class Checked:
    decision: Decision
    detection: Detection | None
    latency_ms: float


class Guard:
    def __init__(self, detector: Detector, engine: PolicyEngine, config: Config,
                 audit: AuditStore | None, escalator: Escalator) -> None:
        self.detector = detector
        self._named: dict[str, Detector] = {}
        self.engine = engine
        self.config = config
        self.settings = config.proxy
        self.audit = audit
        self.escalator = escalator
        self._queue: asyncio.Queue[tuple[Review, dict[str, Any]]] = asyncio.Queue(self.settings.queue_size)
        self._workers: list[asyncio.Task[None]] = []
        self.dropped = 0

    async def check(self, review: Review, answer: str) -> Checked:
        started = time.perf_counter()
        if review.rag is None:
            return Checked(self.engine.unchecked(review.profile, review.topic, "no_context"), None, 0.0)
        if not answer.strip():
            return Checked(self.engine.unchecked(review.profile, review.topic, "no_answer"), None, 0.0)
        budget = self.engine.budget_s(review.profile)
        try:
            detector = await self.detector_for(review.detector)
            detection = await asyncio.wait_for(detector.detect(review.rag, answer), budget)
        except (MorphguardError, asyncio.TimeoutError) as exc:
            reason = (f"latency budget of {budget:g} s exceeded" if isinstance(exc, asyncio.TimeoutError)
                      else f"detector error: {exc}")
            decision = self.engine.failed(review.profile, review.topic, reason)
            if decision.action == "pass":
                log.warning("request %s passed unchecked (fail open): %s", review.request_id, reason)
            else:
                log.warning("request %s blocked unchecked (fail closed): %s", review.request_id, reason)
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
            "time": now(), "request_id": review.request_id, "trace_id": verdict.get("trace_id"), "profile": d.profile, "route": review.route or None,
            "model": review.model, "topic": d.topic, "checked": detection is not None,
            "score": detection.score if detection else None, "threshold": d.threshold, "flagged": d.flagged,
            "action": d.action, "escalated": d.escalate, "reason": d.reason,
            "detector": detection.detector if detection else None,
            "factoids": verdict.get("factoids", []),
            "cost": detection.cost.model_dump(exclude={"stages"}) if detection else None,
            "question": review.rag.question if review.rag else None, "answer": answer,
            "context": "\n\n".join(review.rag.passages) if review.rag else None,
        }
        if self.audit is not None:
            try:
                await asyncio.to_thread(self.audit.record, entry)
            except Exception:
                log.exception("request %s: audit record failed", review.request_id)
        if d.escalate:
            self.escalator.submit({k: entry[k] for k in entry if k not in ("question", "answer", "context")}
                                  | {"verdict": verdict})

    def check_later(self, review: Review, completion: dict[str, Any]) -> dict[str, Any] | None:
        """Queue a review; the verdict to send now, or None when the caller must review inline (queue full)."""
        if review.rag is None:
            return v.pending(review, "no_context")
        try:
            self._queue.put_nowait((review, completion))
            telemetry.queue_changed(+1)
        except asyncio.QueueFull:
            if self.settings.on_queue_full == "inline":
                return None
            self.dropped += 1
            log.warning("async check queue full (%d): check dropped", self.settings.queue_size)
            return v.pending(review, "dropped")
        return v.pending(review, "queued")

    def start(self) -> None:
        self._workers = [asyncio.create_task(self._work()) for _ in range(self.settings.workers)]

    async def _work(self) -> None:
        while True:
            review, completion = await self._queue.get()
            telemetry.queue_changed(-1)
            try:
                _, verdict = await self.review(review, completion, can_change=False, mode="async")
                log.info("async check: %s", {k: verdict.get(k) for k in ("request_id", "score", "flagged", "action")})
            except Exception:
                log.exception("async check crashed")
            finally:
                self._queue.task_done()

    async def stop(self) -> None:
        """Let queued checks finish within the grace period, then stop the workers and deliver escalations."""
        grace = self.settings.shutdown_grace_s
        try:
            await asyncio.wait_for(self._queue.join(), timeout=grace)
        except asyncio.TimeoutError:
            log.warning("shutdown: %d queued checks abandoned after %.0f s", self._queue.qsize(), grace)
        for worker in self._workers:
            worker.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        await self.escalator.aclose(grace)
