"""A streamed answer checked as it flows, whatever the API.

The invariant: under an action that ends a stream (`block`, `regenerate`), every piece of text the client
receives lies in a prefix of the answer (up to the white space after it) that passed the same check that decides
the stream's verdict, that check run on the prefix; text that has not is held. So the decision that ends a
stream is always taken over text still held, and what the client has is never what a verdict blocks. An event
that carries part of the answer the check cannot read as text (a tool call, audio data, an output item that is not
a message: `Stream.opaque`) is held until the stream's verdict, and every event after it with it: it goes out
only if the whole answer passes. Events of pure framing (a role, an empty delta) go as soon as the text before
them passed.

How: the answer text is cut into sentences as it arrives. The release gate is the whole-answer check run on the
answer up to its last finished sentence (a prefix check). At most one prefix check runs at a time: when it
passes, the events whose text ends within its prefix go out, in the upstream's order, and the next prefix check
takes every sentence finished meanwhile (`window`: at least that many new ones), so the number of checks grows
with the stream's duration over the check's latency, not with its sentences. When the upstream ends, the whole
answer (as the API reads it) is checked at once, beside the prefix check under way; if it passes, all goes out;
if it blocks, what the prefix check under way passes still goes out, the rest is withheld and the stream ends as
the API ends a refused answer. A prefix check that blocks mid-stream stops reading the upstream and ends the
stream there. A check's score can exceed the scores of its sentences one by one (evidence adds up over an
answer), which is why a prefix is gated by the whole-answer check and not by a check of its last sentence. The
checks of one stream share what the detector remembers and one budget of judge calls (`GuardChecks.memo`): each
sentence is asked about once. Past that budget a check reads the answer as far as it can and, where the profile
withholds what was not read, blocks for the rest (`PrefixCheck.read_to`): the text it read and passed goes out
first.

The stream's record says what was released apart from what was withheld (`Closing`, `Checks.close`): how many
characters of answer text the client received and the verdict of the prefix they passed.

What an API's stream looks like is the `Stream`'s business (`proxy.stream_modes` adapts any dialect to it);
what a check is and what policy makes of it is the `Checks`' (`GuardChecks` over the proxy's guard). This
module only cuts, holds, orders and releases.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, Protocol, TypeVar

from opentelemetry import trace

from morphguard.config import Action
from morphguard.detectors.text import GrowingText, sentences
from morphguard.policy.actions import claims
from morphguard.policy.engine import Reach
from morphguard.policy.record import DecisionRecord, Released
from morphguard.proxy.check import Answer, CheckOutcome, CheckRequest, Found
from morphguard.proxy.guard import Guard

E = TypeVar("E")
# Actions that end a stream at the prefix they flag: `regenerate` cannot ask again mid-stream, so it withholds.
ENDS_STREAM: frozenset[Action] = frozenset({"block", "regenerate"})


@dataclass(frozen=True)
class Claim:
    """A claim a check placed in the text it read: its offsets, its score and whether it is flagged."""

    start: int
    end: int
    score: float
    flagged: bool


@dataclass(frozen=True)
class PrefixCheck:
    """What came of checking the answer up to some point; `blocks`: the stream must end before that text.
    `whole`: the whole answer was checked (the upstream had ended)."""

    flagged: bool
    blocks: bool
    score: float | None = None
    claims: tuple[Claim, ...] = ()
    whole: bool = False
    outcome: Any = None  # the checker's own record of it, handed back to `Checks.close`
    # A check that read the text only up to a cap and blocks for the unread rest: where that rest begins. The text
    # before it passed this check (it read that text and flagged nothing in it).
    read_to: int | None = None


@dataclass(frozen=True)
class Closing:
    """The stream's last word: the verdict its last event carries, and whether the held rest is withheld
    (then `notice` is what the client is told instead)."""

    verdict: dict[str, Any]
    blocks: bool = False
    notice: str = ""


class Stream(Protocol[E]):
    """What the engine needs to know of one API's stream events."""

    def delta(self, event: E) -> str:
        """The answer text this event adds ("" for none)."""
        ...

    def opaque(self, event: E) -> bool:
        """Whether this event carries part of the answer its text does not say (a tool call, audio data, an output
        that is not text): the check cannot read it, so it waits for the stream's verdict."""
        ...

    def marked(self, event: E, verdict: dict[str, Any]) -> E:
        """The event carrying the verdict of the text that passed (it is the last let out after it)."""
        ...

    def ending(self, sent: Sequence[E], closing: Closing) -> list[E]:
        """The stream's last events after the events `sent`, the very last carrying `closing.verdict`: the
        upstream's own ending, or, where `closing.blocks`, the API's ending of a refused answer."""
        ...


@dataclass(frozen=True)
class Checked:
    """A prefix check: the answer up to `end` and what came of it."""

    end: int
    check: PrefixCheck


class Checks(Protocol):
    fill: int  # how many sentences one judge call of the check reads (1: it does not read them in batches)

    @property
    def closed(self) -> bool:
        """The stream's verdict is recorded."""
        ...

    async def prefix(self, text: str) -> PrefixCheck:
        """Check the answer up to a finished sentence (`text`) with the check that decides the verdict."""
        ...

    async def whole(self, text: str) -> PrefixCheck:
        """Check the whole answer (`text`: all of its text the engine read); no side effects."""
        ...

    async def close(self, text: str, deciding: PrefixCheck, released: Released) -> Closing:
        """Decide and record the stream's verdict from the check `deciding` (the whole answer's, or the prefix
        check that blocked); `released`: the answer text the client received and the check it passed. `text` is
        all the model said that was read."""
        ...


def sentence_verdicts(text: str, check: PrefixCheck, start: int = 0) -> list[dict[str, Any]]:
    """The sentences of `text` from `start` on, each with the verdict of the claims `check` placed in it:
    flagged where one is, scored as its most suspicious one (no score where the check placed none there)."""
    out = []
    for first, last in sentences(text, start):
        inside = [c for c in check.claims if c.start < last and c.end > first]
        entry: dict[str, Any] = {"start": first, "end": last, "flagged": any(c.flagged for c in inside)}
        if inside:
            entry["score"] = round(max(c.score for c in inside), 4)
        out.append(entry)
    return out


@dataclass
class Incremental(Generic[E]):
    """One stream's run: `run(events)` yields what the client may see, in order. `events` are the upstream's
    less its own last event, which the `Stream` holds for the ending."""

    stream: Stream[E]
    checks: Checks
    window: int = 1  # a prefix check waits for at least this many sentences finished since the last
    # After the first prefix check (which gates the first token), a check takes whole multiples of `fill` sentences
    # (the judge's batch: each call full), unless a finished sentence has waited `hold_s` for companions.
    fill: int = 1
    hold_s: float = 0.0
    answer: GrowingText = field(default_factory=GrowingText)  # the answer read so far, cut into sentences as it comes
    checked: list[Checked] = field(default_factory=list)  # every prefix check that finished, in order
    _held: deque[tuple[E, int]] = field(default_factory=deque)  # (event, where its text ends)
    _sent: list[E] = field(default_factory=list)
    _ends: list[int] = field(default_factory=list)  # ends of finished sentences not yet given to a check
    _ends_at: list[float] = field(default_factory=list)  # when each of them was read
    _passed: int = 0  # the answer up to here has passed the check
    _passing: PrefixCheck | None = None  # the check it passed
    _verdicts: list[dict[str, Any]] = field(default_factory=list)  # each passed sentence's, from the check it passed
    _released: int = 0  # the answer text the client has: up to here
    sent: int = 0  # the answer text handed on to the client (each event counted once the consumer took it)
    _announced: int = 0  # how many of `_verdicts` went out on an event

    @property
    def text(self) -> str:
        return str(self.answer)

    @property
    def released(self) -> int:
        """Characters of the answer text the client has been sent so far."""
        return self._released

    async def run(self, events: AsyncIterator[E]) -> AsyncGenerator[E, None]:
        reader = aiter(events)
        read: asyncio.Task[Any] | None = asyncio.ensure_future(_next(reader))
        prefix: asyncio.Task[PrefixCheck] | None = None  # the prefix check under way (at most one)
        upto = 0  # the end of its prefix
        whole: asyncio.Task[PrefixCheck] | None = None  # the whole answer's check, once the upstream has ended
        decided: PrefixCheck | None = None  # the whole answer's verdict, when it blocks while a prefix is checked
        holding: asyncio.Task[None] | None = None  # until the sentences held to fill a check are due
        try:
            while True:
                waiting: set[asyncio.Future[Any]] = {t for t in (read, prefix, whole, holding) if t is not None}
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if holding is not None and holding in done:
                    holding = None
                if prefix is not None and prefix in done:
                    check = prefix.result()
                    prefix = None
                    self.checked.append(Checked(upto, check))
                    if not check.blocks:
                        self._pass(upto, check)
                    if not check.blocks or self._passed_in_part(check):
                        for out, end in self._release():
                            yield out
                            self.sent = max(self.sent, end)
                    if decided is not None:  # the whole answer blocked: what this check passed went out
                        for out in await self._closed(decided):
                            yield out
                        return
                    if check.blocks:  # ends here: the upstream is not read further
                        _cancel(read, whole)
                        for out in await self._closed(check):
                            yield out
                        return
                if whole is not None and whole in done:
                    check = whole.result()
                    whole = None
                    if not check.blocks:
                        _cancel(prefix)
                        for out in await self._closed(check):
                            yield out
                        return
                    if prefix is None:
                        if self._passed_in_part(check):
                            for out, end in self._release():
                                yield out
                                self.sent = max(self.sent, end)
                        for out in await self._closed(check):
                            yield out
                        return
                    decided = check  # the prefix check under way says how much of the answer still goes out
                if read is not None and read in done:
                    event = read.result()
                    read = None
                    if event is _END:
                        whole = asyncio.ensure_future(self.checks.whole(self.text))
                    else:
                        self._take(event)
                        read = asyncio.ensure_future(_next(reader))
                        for out, end in self._release():  # events with no unchecked text before them
                            yield out
                            self.sent = max(self.sent, end)
                if prefix is None and whole is None and decided is None and len(self._ends) >= self.window:
                    taken, due = self._taken()
                    if taken:
                        _cancel(holding)
                        holding = None
                        upto = self._ends[taken - 1]
                        del self._ends[:taken], self._ends_at[:taken]
                        prefix = asyncio.ensure_future(self.checks.prefix(self.text[:upto]))
                    elif holding is None:
                        holding = asyncio.ensure_future(asyncio.sleep(due))
        finally:
            tasks = (read, prefix, whole, holding)
            _cancel(*tasks)
            await _settle(*tasks)
            close = getattr(reader, "aclose", None)
            if close is not None:  # stop reading the upstream now, not when the reader is collected
                with contextlib.suppress(Exception):  # its error, if any, came out of a read already
                    await close()

    def _take(self, event: E) -> None:
        ends = self.answer.add(self.stream.delta(event))
        self._held.append((event, _AT_VERDICT if self.stream.opaque(event) else len(self.answer)))
        if ends:
            self._ends += ends
            self._ends_at += [time.monotonic()] * len(ends)

    def _taken(self) -> tuple[int, float]:
        """How many of the finished sentences the next prefix check takes (0: none yet), and else how long until
        they are due: all of them for the first check and once the oldest has waited `hold_s`; else whole multiples
        of `fill`."""
        waited = time.monotonic() - self._ends_at[0]
        if not self.checked or waited >= self.hold_s:
            return len(self._ends), 0.0
        return len(self._ends) - len(self._ends) % self.fill, self.hold_s - waited

    def _passed_in_part(self, check: PrefixCheck) -> bool:
        """Where a blocking check read the text only up to a cap and flagged nothing there: that text passed it."""
        if check.read_to is None or check.read_to <= self._passed:
            return False
        self._pass(check.read_to, replace(check, blocks=False))
        return True

    def _pass(self, upto: int, check: PrefixCheck) -> None:
        self._verdicts += sentence_verdicts(self.text[:upto], check, self._passed)
        self._passed, self._passing = upto, check

    def _release(self) -> list[tuple[E, int]]:
        """The held events whose text lies in the prefix that passed (with the white space after it), each with
        where its text ends; the last of them carries that prefix's verdict and those of the sentences it let out."""
        out: list[tuple[E, int]] = []
        upto = self.answer.spaces_to(self._passed)
        while self._held and self._held[0][1] <= upto:
            event, end = self._held.popleft()
            out.append((event, end))
            self._released = max(self._released, end)
        let_out = len(self._verdicts)
        while let_out > self._announced and self._verdicts[let_out - 1]["end"] > self._released:
            let_out -= 1
        if out and let_out > self._announced and self._passing is not None:
            verdict = {"sentences": self._verdicts[self._announced:let_out],
                       "passed": _summary(self._passed, self._passing)}
            out[-1] = (self.stream.marked(out[-1][0], verdict), out[-1][1])
            self._announced = let_out
        self._sent += [event for event, _ in out]
        return out

    async def _closed(self, deciding: PrefixCheck) -> list[E]:
        """The stream's last events: what is held (unless withheld), then the ending, carrying the verdict of
        the stream with that of every sentence the deciding check read: a sentence that passed before a block
        with the verdict of the check it passed, the others with the deciding check's."""
        read = self.text if deciding.whole else self.text[:self.checked[-1].end] if self.checked else ""
        if deciding.blocks:
            released = Released(chars=self._released, score=_score(self._passing),
                                flagged=self._passing.flagged if self._passing is not None else None)
            sentences = [*self._verdicts, *sentence_verdicts(read, deciding, self._passed)]
        else:
            released = Released(chars=len(self.text), score=_score(deciding), flagged=deciding.flagged)
            sentences = sentence_verdicts(read, deciding)
        closing = await self.checks.close(self.text, deciding, released)
        rest = [] if closing.blocks else [event for event, _ in self._held]
        self._held.clear()
        self._sent += rest
        verdict = {**closing.verdict, "sentences": sentences}
        return rest + self.stream.ending(self._sent, replace(closing, verdict=verdict))


def _score(check: PrefixCheck | None) -> float | None:
    return round(check.score, 4) if check is not None and check.score is not None else None


def _summary(end: int, check: PrefixCheck) -> dict[str, Any]:
    out: dict[str, Any] = {"end": end, "flagged": check.flagged}
    if check.score is not None:
        out["score"] = round(check.score, 4)
    return out


_END: Any = object()
_AT_VERDICT = sys.maxsize  # where an opaque event's text "ends": it leaves with the stream's verdict, or never


async def _next(reader: AsyncIterator[Any]) -> Any:
    """The next event, or `_END` (a task must not end in StopAsyncIteration)."""
    return await anext(reader, _END)


def _cancel(*tasks: asyncio.Future[Any] | None) -> None:
    for task in tasks:
        if task is not None and not task.done():
            task.cancel()


async def _settle(*tasks: asyncio.Future[Any] | None) -> None:
    """Let cancelled tasks finish, so none is left pending (or its exception unretrieved) after the stream."""
    for task in tasks:
        if task is not None:
            with contextlib.suppress(BaseException):
                await task


class GuardChecks:
    """`Checks` by the proxy's guard: the configured detector on each prefix with the request's question and
    context, policy deciding once on each check as a stream checked as it flows can act on it (`Reach.WITHHOLD`);
    the stream's verdict carried out and audited by the guard. `whole` is the whole answer once the upstream has
    ended, as its dialect reads it (tool calls and all); a prefix is read as an answer of its text alone."""

    def __init__(self, guard: Guard, request: CheckRequest, whole: Callable[[], Answer]) -> None:
        self.guard = guard
        self.request = request
        self.answer = whole
        self.record: DecisionRecord | None = None  # the stream's settled verdict, once closed
        self._cleared: tuple[str, Found] | None = None  # the last prefix that passed: what the check read, found
        self.memo = guard.checker.memo(request)  # the stream's checks: each sentence asked once, within one budget
        self.fill = guard.checker.sentences_per_call(request)

    @property
    def closed(self) -> bool:
        return self.record is not None

    async def prefix(self, text: str) -> PrefixCheck:
        answer = Answer.of_text(text)
        found = await self.guard.find(self.request, answer, self.memo)
        check = _of(self.guard.decide(self.request, answer, found, Reach.WITHHOLD))
        if not check.blocks:
            self._cleared = (self.guard.checked_text(answer), found)
        return check

    async def whole(self, text: str) -> PrefixCheck:
        answer = self.answer()
        cleared = self._cleared
        if cleared is not None and cleared[0].strip() == self.guard.checked_text(answer).strip():
            found = cleared[1]  # that very text was checked: what the check found stands, and policy decides anew
        else:                  # on the whole answer, with all it holds beside that text
            found = await self.guard.find(self.request, answer, self.memo)
        check = replace(_of(self.guard.decide(self.request, answer, found, Reach.WITHHOLD)), whole=True)
        # where the whole check read only part of the answer, its offset is in the text it read (the answer's fields
        # in the check's order); it stands for the engine's text only where the two agree that far
        read_to = check.read_to
        if read_to is not None and self.guard.checked_text(answer)[:read_to] != text[:read_to]:
            check = replace(check, read_to=None)
        return check

    async def close(self, text: str, deciding: PrefixCheck, released: Released) -> Closing:
        outcome: CheckOutcome = deciding.outcome
        span = self.request.chat_span
        answer = self.answer() if deciding.whole else Answer.of_text(text)
        with trace.use_span(span, end_on_exit=False) if span is not None else contextlib.nullcontext():
            self.record = (await self.guard.carry_out(self.request, answer, outcome, released)).record
        return Closing(self.record.payload(), deciding.blocks, outcome.decision.safe_message)


def _of(outcome: CheckOutcome) -> PrefixCheck:
    detection = outcome.detection
    placed: tuple[Claim, ...] = ()
    if detection is not None:
        threshold = outcome.decision.threshold
        placed = tuple(Claim(f.start, f.end, f.score, f.score >= threshold) for f in claims(detection.factoids)
                       if f.start is not None and f.end is not None)
    blocks = outcome.decision.action in ENDS_STREAM
    read_to = detection.unchecked_from if detection is not None and blocks and not outcome.decision.flagged else None
    return PrefixCheck(flagged=outcome.decision.flagged, blocks=blocks,
                       score=detection.score if detection is not None else None, claims=placed, outcome=outcome,
                       read_to=read_to)
