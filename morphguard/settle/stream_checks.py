"""What a stream needs of the settle side, handed over once (`Streaming`): the engine of a stream checked as it
flows with its checks (`GuardChecks`, the engine's `Checks`), the stream's journal entry and its row where it ends
without a verdict.

The checks: each prefix found by the checker and decided by policy as such a stream can act on it (`Reach.WITHHOLD`:
what is still held can be withheld, nothing rewritten), the stream's verdict carried out and audited. What a decision
means to the engine (`PrefixCheck`: does it end the stream, which claims it placed where) is read here, once.
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
from morphguard.settle.incremental import Claim, Closing, E, Incremental, PrefixCheck, Stream
from morphguard.settle.stream_journal import OpenStream
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


class Streaming:
    """What a stream needs of the settle side, handed over once (`Guard.stream`): the engine that checks it as it
    flows (`flowing`), its journal entry once its first text goes out (`sending`), and its row where it ends without
    a verdict (`account`, `left`)."""

    def __init__(self, settler: Settler, request: CheckRequest) -> None:
        self._settler = settler
        self._request = request
        self._journaled: OpenStream | None = None  # the journal entry once text went out: a crash leaves its row
        self._opened = False
        self.checks: GuardChecks | None = None

    def flowing(self, stream: Stream[E], whole: Callable[[], Answer]) -> Incremental[E]:
        """The engine of a stream checked as it flows, over the dialect's `stream`; `whole`: the whole answer once
        the upstream has ended, as the dialect reads it."""
        self.checks = GuardChecks(self._settler, self._request, whole)
        settings = self._settler.config.proxy
        return Incremental(stream, self.checks, settings.stream_window, self.checks.fill, settings.stream_hold_s)

    @property
    def closed(self) -> bool:
        """The verdict of the stream checked as it flows is recorded."""
        return self.checks is not None and self.checks.closed

    def sending(self, sent: int) -> None:
        """Text is about to go out, `sent` characters of it before: the stream journaled before its first, and what
        its client has kept in the journal now and then."""
        if not self._opened:
            self._opened = True
            self._journaled = self._settler.trail.open_stream(self._request)
        elif self._journaled is not None and self._journaled.due():
            self._journaled.released(sent)

    async def account(self, reason: str, text: str) -> None:
        """The row of a stream that ends without a verdict (`reason`), with the text read so far."""
        await self._settler.trail.account(self._request, reason, text)

    def left(self, reason: str, text: str, sent: int | None = None) -> None:
        """`account` from where awaiting is no longer possible (a client that left); `sent`: how many characters of
        the answer's text the client was sent. The journal entry ends once the row is written."""
        self._settler.trail.account_soon(self._request, reason, text, Released(sent) if sent is not None else None,
                                         self._journaled)

    def owed(self) -> None:
        """The verdict's row is owed (the store is away): the journal keeps the stream open until it is written, so
        a crash before that leaves it to the next start (a row written twice is written once)."""
        self._journaled = None

    def ended(self) -> None:
        """The stream's row is written: its journal entry ends."""
        if self._journaled is not None:
            self._journaled.ended()
