"""The checks of a stream checked as it flows (`settle.incremental.Checks`), made by the settle side: each prefix
found by the checker and decided by policy as such a stream can act on it (`Reach.WITHHOLD`: what is still held can
be withheld, nothing rewritten), the stream's verdict carried out and audited. What a decision means to the engine
(`PrefixCheck`: does it end the stream, which claims it placed where) is read here, once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import replace

from opentelemetry import trace

from morphguard.policy.actions import claims
from morphguard.policy.engine import Reach
from morphguard.policy.record import DecisionRecord, Released
from morphguard.settle.check import Settler
from morphguard.settle.incremental import Claim, Closing, PrefixCheck
from morphguard.settle.values import Answer, CheckOutcome, CheckRequest, Found


class GuardChecks:
    """`Checks` by the settle side: the configured detector on each prefix with the request's question and
    context, policy deciding once on each check as a stream checked as it flows can act on it (`Reach.WITHHOLD`);
    the stream's verdict carried out and audited. `whole` is the whole answer once the upstream has
    ended, as its dialect reads it (tool calls and all); a prefix is read as an answer of its text alone."""

    def __init__(self, settler: Settler, request: CheckRequest, whole: Callable[[], Answer]) -> None:
        self.settler = settler
        self.request = request
        self.answer = whole
        self.record: DecisionRecord | None = None  # the stream's settled verdict, once closed
        self._cleared: tuple[str, Found] | None = None  # the last prefix that passed: what the check read, found
        self.memo = settler.checker.memo(request)  # the stream's checks: each sentence asked once, within one budget
        self.fill = settler.checker.sentences_per_call(request)

    @property
    def closed(self) -> bool:
        return self.record is not None

    async def prefix(self, text: str) -> PrefixCheck:
        answer = Answer.of_text(text)
        found = await self.settler.find(self.request, answer, self.memo)
        check = _of(self.settler.decide(self.request, answer, found, Reach.WITHHOLD))
        if not check.blocks:
            self._cleared = (self.settler.checker.answer_text(answer), found)
        return check

    async def whole(self, text: str) -> PrefixCheck:
        answer = self.answer()
        cleared = self._cleared
        if cleared is not None and cleared[0].strip() == self.settler.checker.answer_text(answer).strip():
            found = cleared[1]  # that very text was checked: what the check found stands, and policy decides anew
        else:                  # on the whole answer, with all it holds beside that text
            found = await self.settler.find(self.request, answer, self.memo)
        check = replace(_of(self.settler.decide(self.request, answer, found, Reach.WITHHOLD)), whole=True)
        # where the whole check read only part of the answer, its offset is in the text it read (the answer's fields
        # in the check's order); it stands for the engine's text only where the two agree that far
        read_to = check.read_to
        if read_to is not None and self.settler.checker.answer_text(answer)[:read_to] != text[:read_to]:
            check = replace(check, read_to=None)
        return check

    async def close(self, text: str, deciding: PrefixCheck, released: Released) -> Closing:
        outcome: CheckOutcome = deciding.outcome
        span = self.request.chat_span
        answer = self.answer() if deciding.whole else Answer.of_text(text)
        with trace.use_span(span, end_on_exit=False) if span is not None else contextlib.nullcontext():
            self.record = (await self.settler.carry_out(self.request, answer, outcome, released)).record
        return Closing(self.record.payload(), deciding.blocks, outcome.decision.safe_message)


def _of(outcome: CheckOutcome) -> PrefixCheck:
    detection = outcome.detection
    placed: tuple[Claim, ...] = ()
    if detection is not None:
        threshold = outcome.decision.threshold
        placed = tuple(Claim(f.start, f.end, f.score, f.score >= threshold) for f in claims(detection.factoids)
                       if f.start is not None and f.end is not None)
    blocks = outcome.decision.action == "block"  # decided with `Reach.WITHHOLD`, `regenerate` has become `block`
    read_to = detection.unchecked_from if detection is not None and blocks and not outcome.decision.flagged else None
    return PrefixCheck(flagged=outcome.decision.flagged, blocks=blocks,
                       score=detection.score if detection is not None else None, claims=placed, outcome=outcome,
                       read_to=read_to)
