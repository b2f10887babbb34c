"""Checking an answer and settling it: check → policy's one decision → carry it out (act, or regenerate).

`Checker` finds: the detector within the profile's latency budget, through the verdict cache a fleet shares, here or
by the fleet's workers (`proxy.inline_via: workers`, over `store.queue.WorkerPool`); what the check found (`Found`)
is all it says. `Settler` has policy decide on it once (`policy.engine.PolicyEngine.decide`, given what the answer's
way out can still change: `Reach`), carries that decision out (re-asking the upstream for `regenerate`,
`policy.actions` for the rest) and hands the record to the audit trail (`settle.trail`); nothing here changes the
action.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
import traceback
from dataclasses import replace
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span

from morphguard import telemetry
from morphguard.config import Config, SentencesSettings
from morphguard.detectors import Detector, build_detector, fingerprint
from morphguard.detectors.focus import within
from morphguard.detectors.memo import Memo, remembering
from morphguard.errors import (
    CheckTooLargeError,
    JudgeCallCapError,
    LLMError,
    LLMTimeoutError,
    MorphguardError,
    UnsealedReplyError,
)
from morphguard.fairness import on_behalf_of
from morphguard.lanes import in_thread
from morphguard.llm.client import CallBudget, call_budget
from morphguard.masking import mask_secrets
from morphguard.models import Detection, utf8
from morphguard.policy import actions, answers
from morphguard.policy.engine import NO_CONTEXT, Finding, PolicyEngine, Reach, flags
from morphguard.policy.record import DecisionRecord, Released
from morphguard.settle.shadow import Shadow
from morphguard.settle.trail import Trail
from morphguard.settle.values import Answer, CheckOutcome, CheckRequest, Found, Reask, Settled
from morphguard.store import detections
from morphguard.store.detections import DetectionCache
from morphguard.store.queue import Entry, WorkerPool
from morphguard.telemetry import names

log = logging.getLogger(__name__)


# How often the interpreter hands its lock from one thread to another (Python's default: 5 ms). The checks read text
# in threads (`lanes.in_thread`) beside the event loop; at every hand-over the loop may wait this long behind them.
# At 0.5 ms a small check's time while six clients' largest checks ran fell from 7.5-10 to 3.1 times its time alone
# (benchmarks/isolation.py, 2 shared cores).
SWITCH_INTERVAL_S = 0.0005


class Checker:
    def __init__(self, detector: Detector, engine: PolicyEngine, config: Config, cache: DetectionCache | None = None,
                 pool: WorkerPool | None = None) -> None:
        self.detector = detector
        self._named: dict[str, Detector] = {}
        self.engine = engine
        self.config = config
        self.cache = cache
        self.pool = pool  # set when inline checks go to the workers
        self._fingerprints: dict[str, str] = {}
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))

    def answer_text(self, answer: Answer) -> str:
        """What the check reads of an answer, as policy says (`policy.tool_calls`)."""
        return answers.checked_text(answer.completion, tool_calls=self.config.policy.tool_calls == "check")

    def sentences_per_call(self, request: CheckRequest) -> int:
        """How many of an answer's sentences one judge call of the request's check reads (`sentences.batch`); 1
        for a check that does not read them in batches."""
        name = request.detector or self.detector.name
        return self.config.section("sentences", SentencesSettings).batch if name == "sentences" else 1

    def memo(self, request: CheckRequest) -> Memo:
        """What the checks of one growing answer (a stream's) share: what the detector remembers of its earlier
        checks and, for the check that remembers them (`sentences`: each sentence asked once), one budget of judge
        calls for all of them (`detector.max_judge_calls` bounds the stream). Another check asks about the whole
        prefix each time, so each of its checks keeps the cap of its own."""
        limit = self.config.detector.max_judge_calls
        shared = limit is not None and (request.detector or self.detector.name) == "sentences"
        return Memo(CallBudget(limit) if shared and limit is not None else None)

    async def find(self, request: CheckRequest, answer: Answer, memo: Memo | None = None) -> Found:
        """What the check finds in the answer's text: a detection, a failed check's short code, or why no check
        was made. Deciding on it is policy's (`PolicyEngine.decide`). Past a cap the check reads what fits (the
        answer's first sentences, the context most relevant to them) and says where the unread rest begins
        (`Detection.unchecked_from`, with the cap's code as `failed`). `memo`: shared by the checks of a stream."""
        if request.rag is None:
            return Found(Finding(skipped=NO_CONTEXT))
        started = time.perf_counter()
        text = utf8(self.answer_text(answer))
        if not text.strip():
            return Found(Finding(skipped="no_answer"))
        budget = self.engine.budget_s(request.profile)
        bound: CheckTooLargeError | None = None  # the detector's own bound on its work, where the whole passed it
        try:
            fitted, read = await self._fitted(request, text)
            begun = time.perf_counter()
            while True:
                try:
                    detection = await self._detect_within(fitted, text[:read], memo, budget, begun)
                    break
                except CheckTooLargeError as exc:
                    # the answer's first sentences it could read within its bound: they are checked, the rest is not
                    if exc.read is None or not 0 < exc.read < read:
                        raise
                    bound, read = exc, exc.read
        except (MorphguardError, TimeoutError) as exc:
            return self._failed(exc, started)
        if detection.unchecked_from is None and read == len(text):
            return Found(Finding(detection=detection), (time.perf_counter() - started) * 1000)
        if detection.unchecked_from is not None:
            cap: MorphguardError = JudgeCallCapError(
                "the answer's rest needs more judge calls than detector.max_judge_calls "
                f"({self.config.detector.max_judge_calls}) leaves")
        else:
            cap = CheckTooLargeError(f"the check read {read} of the answer's {len(text)} characters: " + (
                str(bound) if bound is not None else
                f"answer and context are more than detector.max_text_chars ({self.config.detector.max_text_chars})"))
        unchecked = read if detection.unchecked_from is None else detection.unchecked_from
        if not text[:unchecked].strip():  # nothing of it was read
            return self._failed(cap, started)
        telemetry.count_error(_reason(cap))
        return Found(Finding(detection=detection.model_copy(update={"unchecked_from": unchecked}),
                             failed=_reason(cap)), (time.perf_counter() - started) * 1000, mask_secrets(str(cap)))

    async def _detect_within(self, request: CheckRequest, answer: str, memo: Memo | None, budget: float | None,
                             begun: float) -> Detection:
        """The detection, here or by the workers, within what is left of the latency budget since `begun`."""
        left = None if budget is None else max(0.001, budget - (time.perf_counter() - begun))
        if self.pool is not None:
            return await self._detect_by_workers(request, answer, left, memo)
        detector = await self.detector_for(request.detector)
        return await asyncio.wait_for(self._detect(detector, request, answer, memo), left)

    def _failed(self, exc: BaseException, started: float) -> Found:
        # Clients and the audit get a short stable code; the exception chain stays in the log and span.
        reason = _reason(exc)
        _record_masked(exc)
        telemetry.count_error(reason)  # whether policy then fails open or closed: the judge failed either way
        return Found(Finding(failed=reason), (time.perf_counter() - started) * 1000, mask_secrets(str(exc)))

    async def _fitted(self, request: CheckRequest, answer: str) -> tuple[CheckRequest, int]:
        """The request and how much of the answer one check reads within `detector.max_text_chars`: all of it where
        it fits, else the answer's first sentences and the context most relevant to them (`focus.within`)."""
        limit = self.config.detector.max_text_chars
        rag = request.rag
        assert rag is not None
        if limit is None or len(answer) + rag.size("") <= limit:
            return request, len(answer)
        passages, read = await in_thread(within, rag.question, rag.passages, answer, limit,
                                         size=len(answer) + rag.size(""))
        return replace(request, rag=rag.model_copy(update={"passages": passages})), read

    async def _detect(self, detector: Detector, request: CheckRequest, answer: str, memo: Memo | None) -> Detection:
        """The detection, its judge calls bounded by `detector.max_judge_calls` (none past it is sent; a stream's
        checks share one budget, `memo`'s), waiting for the judge and the text-reading threads in the client's turn
        (`fairness`)."""
        with call_budget(self.config.detector.max_judge_calls, memo.budget if memo is not None else None), \
                remembering(memo), on_behalf_of(request.client):
            return await self._detect_or_recall(detector, request, answer)

    async def _detect_or_recall(self, detector: Detector, request: CheckRequest, answer: str) -> Detection:
        assert request.rag is not None
        if self.cache is None:
            return await detector.detect(request.rag, answer)
        name = request.detector or self.config.detector.name
        if name not in self._fingerprints:
            self._fingerprints[name] = fingerprint(self.config, name)
        key = detections.key_of(self._fingerprints[name], request.rag.question, request.rag.passages, answer)
        cached = await self.cache.get(key)
        if cached is not None:
            return Detection.model_validate(cached)
        detection = await detector.detect(request.rag, answer)
        if detection.unchecked_from is None:  # what a check read under a cap is no answer's whole detection
            await self.cache.put(key, detection.model_dump(mode="json"))
        return detection

    async def _detect_by_workers(self, request: CheckRequest, answer: str, budget: float | None,
                                 memo: Memo | None = None) -> Detection:
        """The detection, computed by whichever worker takes the job; failures raise as a local check's would. A
        stream's check takes its memo along and adds what the worker learnt (each sentence asked once per stream)."""
        assert self.pool is not None
        if memo is None:
            return await self._detected_by_workers(request, answer, budget or self.config.judge.timeout_s)
        started = time.perf_counter()
        async with memo.away:
            left = (budget or self.config.judge.timeout_s) - (time.perf_counter() - started)
            return await self._detected_by_workers(request, answer, max(0.001, left), memo)

    async def _detected_by_workers(self, request: CheckRequest, answer: str, timeout_s: float,
                                   memo: Memo | None = None) -> Detection:
        assert self.pool is not None
        job: dict[str, Any] = {"request": request.to_dict(), "answer": answer, "trace": telemetry.carrier()}
        if memo is not None:
            job["memo"] = memo.carried()
        reply = await self.pool.call(request.request_id, {"detect": job}, timeout_s)
        if reply is None:
            raise TimeoutError("no worker answered within the latency budget")
        if memo is not None and isinstance(reply.get("memo"), dict):
            memo.take(reply["memo"])  # a failed check's calls count against the stream's budget too
        error = reply.get("error")
        if error == "judge_timeout":
            raise LLMTimeoutError("the worker's judge timed out")
        if error == "judge_call_cap":
            raise JudgeCallCapError("the check needs more judge calls than detector.max_judge_calls")
        if error == "check_too_large":
            read = reply.get("read")
            raise CheckTooLargeError("the check reads more than its bounds allow",
                                     read=read if isinstance(read, int) else None)
        if error == "unsealed_reply":
            raise UnsealedReplyError("replies came without the fleet key's seal, none from a worker of the fleet")
        if error:
            raise LLMError(f"the worker could not check: {error}")
        return Detection.model_validate(reply["detection"])

    async def detect_for_caller(self, entry: Entry) -> dict[str, Any]:
        """A worker's half of `_detect_by_workers`: the detection or a short error, never an exception."""
        job = entry.payload["detect"]
        request = CheckRequest.from_dict(job["request"])
        if entry.poisoned:
            return {"error": "check_crashed"}
        remaining = entry.payload["deadline"] - time.time()
        if remaining <= 0:
            return {"error": "expired"}  # the caller has given up waiting: spend no judge time on it
        memo = Memo.arriving(job["memo"]) if isinstance(job.get("memo"), dict) else None  # a stream's
        with telemetry.continued(job.get("trace"), names.SPAN_REMOTE_CHECK, request.request_id):
            try:
                detector = await self.detector_for(request.detector)
                detection = await asyncio.wait_for(self._detect(detector, request, job["answer"], memo), remaining)
                reply: dict[str, Any] = {"detection": detection.model_dump(mode="json")}
            except (MorphguardError, TimeoutError) as exc:
                _record_masked(exc)
                reply = {"error": "judge_timeout" if isinstance(exc, TimeoutError) else _reason(exc)}
                if isinstance(exc, CheckTooLargeError) and exc.read is not None:
                    reply["read"] = exc.read
        # what the check learnt and the judge calls it made, failed or not: the stream's budget bounds them all
        return reply if memo is None else {**reply, "memo": memo.learnt()}

    async def aclose(self) -> None:
        """Close what the detectors hold open (a served verifier's connections)."""
        for detector in (self.detector, *self._named.values()):
            closing = getattr(detector, "aclose", None)
            if closing is not None:
                await closing()

    async def detector_for(self, name: str | None) -> Detector:
        """The configured detector, or one a request names, built once and sharing the judge client."""
        if not name or name == self.detector.name:
            return self.detector
        if name not in self._named:
            llm = getattr(self.detector, "llm", None)
            self._named[name] = await asyncio.to_thread(build_detector, self.config, llm, name)
        return self._named[name]


class Settler:
    """Policy's one decision on what the checker found, carried out and handed to the trail."""

    def __init__(self, checker: Checker, engine: PolicyEngine, config: Config, trail: Trail,
                 shadow: Shadow | None = None) -> None:
        self.checker = checker
        self.engine = engine
        self.config = config
        self.trail = trail
        self.shadow = shadow

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
        await self.trail.record(settled.record)
        self._shadowed(request, settled.record)
        return settled

    async def settle_queued(self, request: CheckRequest, answer: Answer) -> Settled:
        """`settle` of an answer that went out before its check (a queued check): its own trace, linked to the
        request's, and returned only once its record is committed (the queue entry is acknowledged after that)."""
        link = request.chat_span.get_span_context() if request.chat_span else None
        with telemetry.guardrail_span(request.request_id, "async", link_to=link) as span:
            outcome = self.decide(request, answer, await self.find(request, answer), Reach.NONE)
            settled = await self._carry_out(span, request, answer, outcome, None)
        await self.trail.record(settled.record, wait_for_store=True)
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
        await self.trail.record(record)
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

    def _shadowed(self, request: CheckRequest, record: DecisionRecord) -> None:
        """A recorded request offered to the shadow candidate, which checks it after the answer has gone."""
        if self.shadow is not None:
            try:
                self.shadow.offer(request, record)
            except Exception:  # the shadow's failure is its own, never the request's
                log.exception("shadow: request %s not offered", request.request_id)


def _reason(exc: BaseException) -> str:
    """The short stable code of a failed check: what clients, the audit and the metrics see."""
    if isinstance(exc, TimeoutError):
        return "latency_budget_exceeded"
    if isinstance(exc, LLMTimeoutError):
        return "judge_timeout"
    if isinstance(exc, CheckTooLargeError):
        return "check_too_large"
    if isinstance(exc, UnsealedReplyError):
        return "unsealed_reply"
    return "judge_call_cap" if isinstance(exc, JudgeCallCapError) else "judge_error"


def _record_masked(exc: BaseException) -> None:
    """The judge's error on the current span, with any secret it echoes masked (litellm's messages may)."""
    trace.get_current_span().record_exception(exc, attributes={
        "exception.message": mask_secrets(str(exc)),
        "exception.stacktrace": mask_secrets("".join(traceback.format_exception(exc)))})
