"""A streamed answer checked as it flows, whatever the API.

The upstream's events go out in order, each once every sentence of answer text up to its end has passed its
check; only the text still being checked is held back. Each finished sentence (`window` at a time) is checked
as soon as it is complete, while the model writes the next. At the upstream's end the last sentence and the
whole answer are checked at once. A check that ends the stream (a `block`) stops reading the upstream: the held
text never leaves, and the stream ends as the API ends a refused answer.

What an API's stream looks like is the `Stream`'s business (`proxy.stream_modes` adapts any dialect to it);
what a check is and what policy makes of it is the `Checks`' (`GuardChecks` over the proxy's guard). This
module only cuts, holds, orders and releases.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, Protocol, TypeVar

from opentelemetry import trace

from morphguard.config import Action
from morphguard.detectors.text import sentence_ends
from morphguard.policy.record import DecisionRecord
from morphguard.proxy.check import CheckOutcome, CheckRequest
from morphguard.proxy.dialects.base import as_completion
from morphguard.proxy.guard import Guard

E = TypeVar("E")
# Actions that end a stream at the sentence they flag: `regenerate` cannot ask again mid-stream, so it withholds.
ENDS_STREAM: frozenset[Action] = frozenset({"block", "regenerate"})


@dataclass(frozen=True)
class SentenceCheck:
    """What came of checking one piece of the answer; `blocks`: the stream must end before it."""

    flagged: bool
    blocks: bool
    score: float | None = None
    outcome: Any = None  # the checker's own record of it, handed back to `Checks.close`


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

    def marked(self, event: E, verdict: dict[str, Any]) -> E:
        """The event carrying the verdicts of sentences that passed (it is the last let out after them)."""
        ...

    def ending(self, sent: Sequence[E], closing: Closing) -> list[E]:
        """The stream's last events after the events `sent`, the very last carrying `closing.verdict`: the
        upstream's own ending, or, where `closing.blocks`, the API's ending of a refused answer."""
        ...


@dataclass(frozen=True)
class Checked:
    """A checked piece of the answer: its place in the answer text and its check."""

    start: int
    end: int
    check: SentenceCheck

    def payload(self) -> dict[str, Any]:
        out: dict[str, Any] = {"start": self.start, "end": self.end, "flagged": self.check.flagged}
        if self.check.score is not None:
            out["score"] = round(self.check.score, 4)
        return out


class Checks(Protocol):
    async def sentence(self, text: str) -> SentenceCheck:
        """Check one piece of the answer (one sentence, or `window` of them)."""
        ...

    async def whole(self, text: str) -> Any:
        """Check the whole answer; no side effects (it may be cancelled when a sentence blocks first)."""
        ...

    async def close(self, text: str, whole: Any, blocked: Checked | None) -> Closing:
        """Decide and record the stream's verdict: from the whole answer's check, or from the piece that
        blocked it (then `whole` is None). `text` is all the model said that was read."""
        ...


@dataclass
class _Pending:
    start: int  # where the piece's words begin and end in the answer text
    end: int
    cut: int  # where the piece ends with the white space after it: its events go once they end by here
    task: asyncio.Task[SentenceCheck]


# Sentence checks one stream may have running at once. Past it the upstream is not read until one finishes, so an
# answer of thousands of sentences cannot fill the judge's queue ahead of every other request.
MAX_IN_FLIGHT = 8


@dataclass
class Incremental(Generic[E]):
    """One stream's run: `run(events)` yields what the client may see, in order. `events` are the upstream's
    less its own last event, which the `Stream` holds for the ending."""

    stream: Stream[E]
    checks: Checks
    window: int = 1
    text: str = ""  # the answer read so far
    checked: list[Checked] = field(default_factory=list)
    _held: deque[tuple[E, int]] = field(default_factory=deque)  # (event, where its text ends)
    _sent: list[E] = field(default_factory=list)
    _pending: deque[_Pending] = field(default_factory=deque)
    _cut: int = 0  # where the text not yet given to a check begins
    _ends: list[int] = field(default_factory=list)  # ends of finished sentences not yet given to a check
    _unannounced: list[Checked] = field(default_factory=list)  # passed; its verdict not yet on an event
    _passed: int = 0  # the text up to here has passed its checks

    async def run(self, events: AsyncIterator[E]) -> AsyncGenerator[E, None]:
        reader = aiter(events)
        read: asyncio.Task[Any] | None = asyncio.ensure_future(_next(reader))
        whole: asyncio.Task[Any] | None = None
        ended = False  # the upstream's events are all read; `read` None but not ended: paused for checks to finish
        try:
            while not ended or self._pending:
                head = self._pending[0].task if self._pending else None
                waiting: set[asyncio.Future[Any]] = {t for t in (read, head) if t is not None}
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if head is not None and head in done:
                    piece = self._pending.popleft()
                    checked = Checked(piece.start, piece.end, head.result())
                    self.checked.append(checked)
                    if checked.check.blocks:
                        _cancel(read, whole, *(p.task for p in self._pending))
                        # what passed before it goes out, however far the upstream has got meanwhile
                        for out in [*self._release(), *self._closed(await self.checks.close(self.text, None,
                                                                                            checked))]:
                            yield out
                        return
                    self._unannounced.append(checked)
                    self._passed = piece.cut
                    if not ended:  # once the upstream has ended, the rest waits for the whole answer
                        for out in self._release():
                            yield out
                    if read is None and not ended and len(self._pending) < MAX_IN_FLIGHT:
                        read = asyncio.ensure_future(_next(reader))
                if read is not None and read in done:
                    event = read.result()
                    read = None
                    if event is _END:
                        ended = True
                        self._dispatch(final=True)
                        whole = asyncio.ensure_future(self.checks.whole(self.text))
                    else:
                        self._take(event)
                        if len(self._pending) < MAX_IN_FLIGHT:  # else the upstream waits: one stream, few checks
                            read = asyncio.ensure_future(_next(reader))
                        for out in self._release():  # events with no unchecked text before them
                            yield out
            closing = await self.checks.close(self.text, await whole if whole is not None else None, None)
            for out in self._closed(closing):
                yield out
        finally:
            tasks = (read, whole, *(p.task for p in self._pending))
            _cancel(*tasks)
            await _settle(*tasks)
            close = getattr(reader, "aclose", None)
            if close is not None:  # stop reading the upstream now, not when the reader is collected
                with contextlib.suppress(Exception):  # its error, if any, came out of a read already
                    await close()

    def _take(self, event: E) -> None:
        self.text += self.stream.delta(event)
        self._held.append((event, len(self.text)))
        self._dispatch(final=False)

    def _dispatch(self, final: bool) -> None:
        """Start a check of each `window` of finished sentences (at the end: of whatever is left)."""
        self._ends += sentence_ends(self.text, self._ends[-1] if self._ends else self._cut)
        while len(self._ends) >= self.window or (final and self._cut < len(self.text)):
            end = self._ends[self.window - 1] if len(self._ends) >= self.window else len(self.text)
            self._ends = [e for e in self._ends if e > end]
            raw = self.text[self._cut:end]
            piece = raw.strip()
            if not piece:  # white space alone (a blank line): it goes with the next piece
                if end == len(self.text):
                    self._cut = end
                continue
            start = self._cut + len(raw) - len(raw.lstrip())
            task = asyncio.ensure_future(self.checks.sentence(piece))
            self._pending.append(_Pending(start, start + len(piece), end, task))
            self._cut = end

    def _release(self) -> list[E]:
        """The held events whose text has all passed; the last of them carries the sentence verdicts not yet
        given."""
        out = []
        upto = self._passed  # with the white space after it
        while upto < len(self.text) and self.text[upto].isspace():
            upto += 1
        while self._held and self._held[0][1] <= upto:
            out.append(self._held.popleft()[0])
        if out and self._unannounced:
            out[-1] = self.stream.marked(out[-1], {"sentences": [c.payload() for c in self._unannounced]})
            self._unannounced = []
        self._sent += out
        return out

    def _closed(self, closing: Closing) -> list[E]:
        """The stream's last events: what is held (unless withheld), then the ending, carrying the verdict of
        the stream with that of every sentence."""
        rest = [] if closing.blocks else [event for event, _ in self._held]
        self._held.clear()
        self._sent += rest
        verdict = {**closing.verdict, "sentences": [c.payload() for c in self.checked]}
        return rest + self.stream.ending(self._sent, replace(closing, verdict=verdict))


_END: Any = object()


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
    """`Checks` by the proxy's guard: the configured detector on each piece with the request's question and
    context, the rule of the request's profile and topic deciding; the stream's verdict settled (decided,
    audited, escalated) as the guard settles any answer. `answer` is the whole answer once the upstream has
    ended, as its dialect reads it (tool calls and all), given the text the engine read."""

    def __init__(self, guard: Guard, request: CheckRequest,
                 answer: Callable[[str], dict[str, Any]] | None = None) -> None:
        self.guard = guard
        self.request = request
        self.answer = answer or _completion
        self.record: DecisionRecord | None = None  # the stream's settled verdict, once closed

    async def sentence(self, text: str) -> SentenceCheck:
        outcome = await self.guard.checker.check(self.request, _completion(text))
        detection = outcome.detection
        return SentenceCheck(flagged=outcome.decision.flagged, blocks=outcome.decision.action in ENDS_STREAM,
                             score=detection.score if detection is not None else None, outcome=outcome)

    async def whole(self, text: str) -> CheckOutcome:
        return await self.guard.checker.check(self.request, self.answer(text))

    async def close(self, text: str, whole: Any, blocked: Checked | None) -> Closing:
        outcome: CheckOutcome = _placed(blocked.check.outcome, blocked.start) if blocked is not None else whole
        blocks = outcome.decision.action in ENDS_STREAM
        # What was sent cannot be highlighted or cited any more; only what is still held can be withheld.
        span = self.request.chat_span
        with trace.use_span(span, end_on_exit=False) if span is not None else contextlib.nullcontext():
            _, self.record = await self.guard.settle(
                self.request, _completion(text) if blocked is not None else self.answer(text), outcome=outcome,
                can_change=blocks)
        return Closing(self.record.payload(), blocks, outcome.decision.safe_message)


def _completion(text: str) -> dict[str, Any]:
    return as_completion({"role": "assistant", "content": text})


def _placed(outcome: CheckOutcome, start: int) -> CheckOutcome:
    """A piece's outcome with its claims' offsets moved from the piece into the whole answer."""
    detection = outcome.detection
    if detection is None or not start:
        return outcome
    factoids = [f.model_copy(update={"start": f.start + start if f.start is not None else None,
                                     "end": f.end + start if f.end is not None else None})
                for f in detection.factoids]
    return CheckOutcome(outcome.decision, detection.model_copy(update={"factoids": factoids}), outcome.latency_ms)
