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
checks of one stream share what the detector remembers and one budget of judge calls (`GuardChecks.memo`, in
`settle.stream_checks`): each sentence is asked about once. Past that budget a check reads the answer as far as it
can and, where the profile withholds what was not read, blocks for the rest (`PrefixCheck.read_to`): the text it
read and passed goes out first.

The stream's record says what was released apart from what was withheld (`Closing`, `Checks.close`): how many
characters of answer text the client received and the verdict of the prefix they passed.

What an API's stream looks like is the `Stream`'s business (`proxy.stream_modes` adapts any dialect to it);
what a check is and what policy makes of it is the `Checks`' (`settle.stream_checks.GuardChecks`, beside it). This
module only cuts, holds, orders and releases.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, Protocol, TypeVar

from morphguard.detectors.text import GrowingText, sentences
from morphguard.masking import mask_secrets
from morphguard.policy.record import Released

E = TypeVar("E")
log = logging.getLogger(__name__)
_Hand = Callable[[Sequence[tuple[E, int | None]]], Awaitable[None]]  # events let out, each with where its text ends


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
    _news: asyncio.Event = field(default_factory=asyncio.Event)  # the upstream said more (or ended)
    _ended: asyncio.Event = field(default_factory=asyncio.Event)  # the upstream has ended
    _checking: bool = False  # a prefix check is under way
    _idle: asyncio.Event = field(default_factory=asyncio.Event)  # no events let out are on their way to the client

    @property
    def text(self) -> str:
        return str(self.answer)

    @property
    def released(self) -> int:
        """Characters of the answer text the client has been sent so far."""
        return self._released

    async def run(self, events: AsyncIterator[E]) -> AsyncGenerator[E, None]:
        """What the client may see, in order. The run's work (`_decided`) hands each batch of released events over
        and waits until the client has taken them, as the events of one decision go out together; when the client
        leaves, the work is cancelled (the upstream's reading and the check under way with it)."""
        reader = aiter(events)
        self._idle.set()
        handed: asyncio.Queue[tuple[Sequence[tuple[E, int | None]], asyncio.Future[None]] | None] = asyncio.Queue()

        async def hand(out: Sequence[tuple[E, int | None]]) -> None:
            if out:
                taken = asyncio.get_running_loop().create_future()
                handed.put_nowait((out, taken))
                self._idle.clear()
                await taken

        async def work() -> None:
            try:
                await hand([(event, None) for event in await self._closed(await self._decided(reader, hand))])
            finally:
                handed.put_nowait(None)

        working = asyncio.ensure_future(work())
        try:
            while (batch := await handed.get()) is not None:
                out, taken = batch
                for event, end in out:
                    yield event
                    if end is not None:
                        self.sent = max(self.sent, end)
                if not taken.done():  # (the work may have stopped waiting: a whole answer that passed decides at once)
                    taken.set_result(None)
                if handed.empty():
                    self._idle.set()
            await working  # its error, if any, is the stream's
        finally:
            working.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):  # raised above already, or cut short here
                await working
            close = getattr(reader, "aclose", None)
            if close is not None:  # stop reading the upstream now, not when the reader is collected
                with contextlib.suppress(Exception):  # its error, if any, came out of a read already
                    await close()

    async def _decided(self, reader: AsyncIterator[E], hand: _Hand[E]) -> PrefixCheck:
        """The check that decides the stream, with what it let out handed on. Three activities: reading the upstream,
        the prefix checks (one at a time, while the upstream flows) and, once the upstream has ended, the whole
        answer's check beside the prefix check under way. A prefix check that blocks decides (the upstream is not
        read further); a whole answer that passes decides at once (the prefix check under way is dropped); one that
        blocks decides once the prefix check under way has said how much of the answer still goes out."""
        try:
            async with asyncio.TaskGroup() as group:
                reading = group.create_task(self._read(reader, hand))
                gating = group.create_task(self._prefixes(hand))
                whole = group.create_task(self._whole())
                await asyncio.wait((gating, whole), return_when=asyncio.FIRST_COMPLETED)
                blocked = gating.result() if gating.done() else None
                if blocked is not None:
                    reading.cancel()
                    whole.cancel()
                    return blocked
                check = await whole
                if not check.blocks:
                    gating.cancel()
                    return check
                if self._checking:  # the prefix check under way says how much of the answer still goes out
                    await gating
                else:
                    gating.cancel()
                    if self._passed_in_part(check):
                        await hand(self._release())
                return check
        except BaseExceptionGroup as failed:  # an activity failed (the upstream broke, a check raised): its error
            for also in failed.exceptions[1:]:  # others that failed as they were cancelled: said, not raised
                log.warning("stream: %s also failed while the stream ended: %s", type(also).__name__,
                            mask_secrets(str(also)))
            raise failed.exceptions[0] from None

    async def _read(self, reader: AsyncIterator[E], hand: _Hand[E]) -> None:
        """Take the upstream's events as they come, handing on those with no unchecked text before them."""
        async for event in reader:
            await self._idle.wait()  # what was read meanwhile is taken once the events let out have gone
            self._take(event)
            self._news.set()
            await hand(self._release())
            await asyncio.sleep(0)  # the gate's turn: a check due on what this event finished starts before the next
        await self._idle.wait()
        self._ended.set()
        self._news.set()

    async def _prefixes(self, hand: _Hand[E]) -> PrefixCheck | None:
        """Prefix checks, one at a time, while the upstream flows; what each passes handed on. The check that
        blocks, or None once the upstream has ended (and the check under way then has finished)."""
        while (upto := await self._due()) is not None:
            self._checking = True
            check = await self.checks.prefix(self.text[:upto])
            self._checking = False
            self.checked.append(Checked(upto, check))
            if not check.blocks:
                self._pass(upto, check)
            if not check.blocks or self._passed_in_part(check):
                await hand(self._release())
            if check.blocks:
                return check
        return None

    async def _whole(self) -> PrefixCheck:
        """The whole answer's check, once the upstream has ended."""
        await self._ended.wait()
        return await self.checks.whole(self.text)

    async def _due(self) -> int | None:
        """Where the next prefix check ends, once it is due: `window` sentences finished since the last, and the
        hold rules (`_taken`); None once the upstream has ended."""
        while not self._ended.is_set():
            wait: float | None = None
            if len(self._ends) >= self.window:
                taken, wait = self._taken()
                if taken:
                    upto = self._ends[taken - 1]
                    del self._ends[:taken], self._ends_at[:taken]
                    return upto
            self._news.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._news.wait()
        return None

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


_AT_VERDICT = sys.maxsize  # where an opaque event's text "ends": it leaves with the stream's verdict, or never
