"""The engine that checks a stream as it flows, over in-memory event streams: where it cuts sentences, what it
holds back, what it never lets out, what runs at once, and how it ends when the client or the upstream goes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pytest

from morphguard.config import ProxySettings
from morphguard.models import RagInput
from morphguard.proxy.check import CheckRequest
from morphguard.proxy.incremental import Checked, Closing, Incremental, SentenceCheck
from morphguard.proxy.stream_modes import stream_mode


@dataclass(frozen=True)
class Ev:
    text: str = ""
    kind: str = "delta"
    verdict: dict[str, Any] | None = None


class Plain:
    """A stream of text events; it ends with one `end` event, or, refused, one `filtered` event with the notice.
    What was sent before the ending is kept."""

    def __init__(self) -> None:
        self.sent: list[Ev] = []

    def delta(self, event: Ev) -> str:
        return event.text if event.kind == "delta" else ""

    def marked(self, event: Ev, verdict: dict[str, Any]) -> Ev:
        return replace(event, verdict=verdict)

    def ending(self, sent: Sequence[Ev], closing: Closing) -> list[Ev]:
        self.sent = list(sent)
        if closing.blocks:
            return [Ev(closing.notice, kind="filtered", verdict=closing.verdict)]
        return [Ev(kind="end", verdict=closing.verdict)]


class Judge:
    """Flags every piece containing "FALSE"; a piece with "BLOCK" ends the stream. `gates` hold a piece's check
    until the test opens it (by the start of its text); what started, finished and was cancelled is kept."""

    def __init__(self, whole_blocks: bool = False) -> None:
        self.started: list[str] = []
        self.finished: list[str] = []
        self.cancelled: list[str] = []
        self.gates: dict[str, asyncio.Event] = {}
        self.whole_blocks = whole_blocks
        self.closed: tuple[str, Any, Checked | None] | None = None

    async def _wait(self, text: str) -> None:
        self.started.append(text)
        try:
            gate = next((g for key, g in self.gates.items() if text.startswith(key)), None)
            if gate is not None:
                await gate.wait()
            await asyncio.sleep(0)
        except asyncio.CancelledError:
            self.cancelled.append(text)
            raise
        self.finished.append(text)

    async def sentence(self, text: str) -> SentenceCheck:
        await self._wait(text)
        flagged = "FALSE" in text or "BLOCK" in text
        return SentenceCheck(flagged=flagged, blocks="BLOCK" in text, score=0.9 if flagged else 0.1)

    async def whole(self, text: str) -> str:
        await self._wait("whole:" + text)
        return "whole-verdict"

    async def close(self, text: str, whole: Any, blocked: Checked | None) -> Closing:
        self.closed = (text, whole, blocked)
        blocks = blocked is not None or self.whole_blocks
        return Closing({"action": "block" if blocks else "annotate"}, blocks, "Withheld.")


class Upstream:
    """Events the test pushes one at a time (None ends the stream, an exception breaks it); what was read."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Ev | BaseException | None] = asyncio.Queue()
        self.read: list[Ev] = []
        self.closed = False

    def push(self, *items: Ev | BaseException | None) -> None:
        for item in items:
            self.queue.put_nowait(item)

    async def events(self) -> AsyncIterator[Ev]:
        try:
            while True:
                item = await self.queue.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                self.read.append(item)
                yield item
        finally:
            self.closed = True


def deltas(*texts: str) -> list[Ev]:
    return [Ev(t) for t in texts]


async def collect(engine: Incremental[Ev], upstream: Upstream) -> list[Ev]:
    return [e async for e in engine.run(upstream.events())]


def text_of(events: list[Ev]) -> str:
    return "".join(e.text for e in events if e.kind == "delta")


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def test_sentences_are_cut_across_deltas_and_every_event_goes_out_in_order():
    async def run() -> None:
        judge, upstream = Judge(), Upstream()
        events = [Ev(kind="role"), *deltas("Paris is", " the capital. It", " has 2.1 million", " people.\n",
                                           "Its river is the Seine"), Ev(kind="finish")]
        upstream.push(*events, None)
        out = await collect(Incremental(Plain(), judge), upstream)
        assert [replace(e, verdict=None) for e in out] == [*events, Ev(kind="end")]
        assert judge.started[:3] == ["Paris is the capital.", "It has 2.1 million people.", "Its river is the Seine"]
        assert judge.started[3] == "whole:" + text_of(events)
        last = out[-1].verdict
        assert last is not None and last["action"] == "annotate"
        assert [s["start"] for s in last["sentences"]] == [0, 22, 49]  # offsets into the whole answer
        assert judge.closed is not None and judge.closed[1] == "whole-verdict"

    asyncio.run(run())


def test_a_sentence_is_held_back_until_its_check_passes_and_the_next_is_read_meanwhile():
    async def run() -> None:
        judge, upstream = Judge(), Upstream()
        judge.gates["One"] = asyncio.Event()
        engine = Incremental(Plain(), judge)
        out: list[Ev] = []

        async def consume() -> None:
            async for event in engine.run(upstream.events()):
                out.append(event)

        task = asyncio.create_task(consume())
        upstream.push(Ev(kind="role"), *deltas("One is ", "true. Two", " is true. Three"))
        await settle()
        # the role event has no text before it and went at once; nothing of sentence one left while it is checked
        assert [e.kind for e in out] == ["role"]
        # ...but the upstream kept being read, and sentence two's check started while one's still runs
        assert text_of(upstream.read) == "One is true. Two is true. Three"
        assert judge.started == ["One is true.", "Two is true."] and judge.finished == ["Two is true."]
        judge.gates["One"].set()
        await settle()
        # one passed, then two (checked already): the events up to two's end go, not the one that starts
        # sentence three; each sentence's verdict rides on the last event let out after its check
        assert text_of(out) == "One is true. Two"
        assert [e.verdict for e in out[1:]] == [
            {"sentences": [{"start": 0, "end": 12, "flagged": False, "score": 0.1}]},
            {"sentences": [{"start": 13, "end": 25, "flagged": False, "score": 0.1}]}]
        upstream.push(Ev(kind="finish"), None)
        await task
        assert text_of(out) == "One is true. Two is true. Three"
        assert [e.kind for e in out[-2:]] == ["finish", "end"]

    asyncio.run(run())


def test_checks_of_later_sentences_run_while_an_earlier_one_is_checked():
    async def run() -> None:
        judge, upstream = Judge(), Upstream()
        judge.gates["One"] = asyncio.Event()
        task = asyncio.create_task(collect(Incremental(Plain(), judge), upstream))
        upstream.push(*deltas("One. ", "Two. ", "Three. "))
        await settle()
        assert judge.started == ["One.", "Two.", "Three."]
        assert judge.finished == ["Two.", "Three."]  # done, but held: one goes first
        judge.gates["One"].set()
        upstream.push(None)
        out = await task
        assert text_of(out) == "One. Two. Three. "

    asyncio.run(run())


def test_a_blocking_sentence_never_leaves_and_the_stream_ends_with_the_content_filter_ending():
    async def run() -> None:
        judge, upstream = Judge(), Upstream()
        judge.gates["This is BLOCK"] = asyncio.Event()
        judge.gates["More"] = asyncio.Event()  # still being checked when the block comes
        task = asyncio.create_task(collect(Incremental(Plain(), judge), upstream))
        upstream.push(Ev(kind="role"), *deltas("Fine start. ", "This is BL", "OCK material. More", " text. And"))
        await settle()
        assert "More text." in judge.started
        judge.gates["This is BLOCK"].set()
        out = await task
        assert text_of(out) == "Fine start. "
        assert "BLOCK" not in "".join(e.text for e in out)
        assert [e.kind for e in out][-1] == "filtered" and out[-1].text == "Withheld."
        verdict = out[-1].verdict
        assert verdict is not None and verdict["action"] == "block"
        assert verdict["sentences"][-1] == {"start": 12, "end": 35, "flagged": True, "score": 0.9}
        assert judge.closed is not None and judge.closed[2] is not None and judge.closed[1] is None
        assert "More text." in judge.cancelled  # the checks under way are cancelled...
        assert upstream.closed  # ...and the upstream is no longer read

    asyncio.run(run())


def test_what_passed_before_a_blocking_sentence_goes_out_even_when_the_upstream_ended_first():
    async def run() -> None:
        judge, upstream = Judge(), Upstream()
        judge.gates["Fine"] = asyncio.Event()
        task = asyncio.create_task(collect(Incremental(Plain(), judge), upstream))
        upstream.push(*deltas("Fine start. ", "This is BLOCK. ", "More."), Ev(kind="finish"), None)
        await settle()
        assert upstream.closed and "whole:Fine start. This is BLOCK. More." in judge.started
        judge.gates["Fine"].set()
        out = await task
        assert text_of(out) == "Fine start. "
        assert [e.kind for e in out][-1] == "filtered"

    asyncio.run(run())


def test_the_last_sentence_and_the_whole_answer_are_checked_at_once_and_a_whole_answer_block_withholds_the_rest():
    async def run() -> None:
        judge, upstream = Judge(whole_blocks=True), Upstream()
        judge.gates["Last"] = asyncio.Event()
        task = asyncio.create_task(collect(Incremental(Plain(), judge), upstream))
        upstream.push(*deltas("First one. ", "Last one"), Ev(kind="finish"), None)
        await settle()
        assert "Last one" in judge.started and "whole:First one. Last one" in judge.started
        assert "Last one" not in judge.finished and "whole:First one. Last one" in judge.finished
        judge.gates["Last"].set()
        out = await task
        assert text_of(out) == "First one. "  # the last sentence was held for the whole answer's verdict
        assert out[-1].kind == "filtered" and out[-1].verdict is not None and out[-1].verdict["action"] == "block"
        assert [e.kind for e in out].count("finish") == 0

    asyncio.run(run())


def test_a_window_checks_several_sentences_together():
    async def run() -> None:
        judge, upstream = Judge(), Upstream()
        upstream.push(*deltas("A one. ", "B two. ", "C three. ", "D four"), None)
        out = await collect(Incremental(Plain(), judge, window=2), upstream)
        assert judge.started[:2] == ["A one. B two.", "C three. D four"]
        assert text_of(out) == "A one. B two. C three. D four"

    asyncio.run(run())


def test_flagged_sentences_under_a_non_blocking_rule_go_out_with_their_verdicts():
    async def run() -> None:
        judge, upstream = Judge(), Upstream()
        upstream.push(*deltas("This is FALSE. ", "This is fine. ", "End"), Ev(kind="finish"), None)
        out = await collect(Incremental(Plain(), judge), upstream)
        assert text_of(out) == "This is FALSE. This is fine. End"
        marked = [e.verdict for e in out if e.verdict is not None]
        assert marked[0] == {"sentences": [{"start": 0, "end": 14, "flagged": True, "score": 0.9}]}
        assert marked[-1] is not None and [s["flagged"] for s in marked[-1]["sentences"]] == [True, False, False]

    asyncio.run(run())


def test_a_client_that_leaves_cancels_the_checks_and_stops_reading_the_upstream():
    async def run() -> None:
        judge, upstream = Judge(), Upstream()
        judge.gates["Two"] = asyncio.Event()
        stream = Incremental(Plain(), judge).run(upstream.events())
        upstream.push(Ev(kind="role"), *deltas("One. Two. ", "Three"))
        first = await anext(stream)
        assert first.kind == "role"
        pulling = asyncio.ensure_future(anext(stream))  # the server asks for more; "One. Two. " waits for "Two."
        await settle()
        assert judge.started == ["One.", "Two."] and not pulling.done()
        pulling.cancel()  # what Starlette does when the client goes
        with pytest.raises(asyncio.CancelledError):
            await pulling
        await stream.aclose()
        assert "Two." in judge.cancelled
        assert upstream.closed

    asyncio.run(run())


def test_a_cancelled_response_task_cancels_the_checks():
    async def run() -> None:
        judge, upstream = Judge(), Upstream()
        judge.gates["One"] = asyncio.Event()
        task = asyncio.create_task(collect(Incremental(Plain(), judge), upstream))
        upstream.push(*deltas("One. ", "Two"))
        await settle()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert "One." in judge.cancelled and upstream.closed

    asyncio.run(run())


def test_an_upstream_error_mid_stream_is_raised_and_no_unchecked_text_leaves():
    async def run() -> None:
        judge, upstream = Judge(), Upstream()
        judge.gates["Two"] = asyncio.Event()
        out: list[Ev] = []
        upstream.push(*deltas("One. ", "Two. ", "Three"), ConnectionResetError("dropped"))
        with pytest.raises(ConnectionResetError):
            async for event in Incremental(Plain(), judge).run(upstream.events()):
                out.append(event)
        assert text_of(out) == "One. "
        assert "Two." in judge.cancelled and judge.closed is None

    asyncio.run(run())


def test_a_check_that_fails_unexpectedly_ends_the_stream_with_its_error():
    class Broken(Judge):
        async def sentence(self, text: str) -> SentenceCheck:
            raise RuntimeError("detector bug")

    async def run() -> None:
        upstream = Upstream()
        upstream.push(*deltas("One. ", "Two"), None)
        with pytest.raises(RuntimeError, match="detector bug"):
            await collect(Incremental(Plain(), Broken()), upstream)
        assert upstream.closed

    asyncio.run(run())


def _request(body: dict[str, Any], rag: bool = True) -> CheckRequest:
    return CheckRequest(body=body, rag=RagInput(question="q", passages=["p"]) if rag else None, source="tool",
                        profile="general", topic="general")


@pytest.mark.parametrize(("configured", "action", "body", "rag", "expected"), [
    ("auto", "block", {}, True, "incremental"),
    ("auto", "regenerate", {}, True, "incremental"),
    ("auto", "annotate", {}, True, "passthrough"),
    ("auto", "pass", {}, True, "passthrough"),
    ("auto", "block", {}, False, "passthrough"),  # nothing to check against
    ("auto", "block", {"tools": [{"type": "function"}]}, True, "buffer"),  # tool calls are checked whole
    ("incremental", "annotate", {}, True, "incremental"),
    ("buffer", "block", {}, True, "buffer"),
    ("passthrough", "block", {}, True, "passthrough"),
])
def test_the_stream_mode_of_a_request(configured, action, body, rag, expected):
    settings = ProxySettings(stream_mode=configured)
    assert stream_mode(settings, action, _request(body, rag), tool_calls_checked=True) == expected


def test_auto_queues_the_check_of_a_stream_that_cannot_be_changed_under_async_checks():
    settings = ProxySettings(stream_mode="auto", mode="async")
    assert stream_mode(settings, "annotate", _request({}), tool_calls_checked=True) == "async"
    assert stream_mode(settings, "block", _request({"tools": [{}]}), tool_calls_checked=False) == "incremental"


def test_one_stream_runs_at_most_max_in_flight_checks_and_the_upstream_waits_meanwhile():
    from morphguard.proxy.incremental import MAX_IN_FLIGHT

    async def run() -> None:
        judge, upstream = Judge(), Upstream()
        gate = asyncio.Event()
        judge.gates["Claim"] = gate
        upstream.push(*deltas(*(f"Claim {i} holds. " for i in range(50))), None)
        engine = Incremental(Plain(), judge)
        task = asyncio.ensure_future(collect(engine, upstream))
        for _ in range(10):
            await settle()
        assert len(judge.started) == MAX_IN_FLIGHT  # the rest of the answer is not read while these run
        assert len(upstream.read) == MAX_IN_FLIGHT
        gate.set()
        out = await task
        assert len([s for s in judge.started if s.startswith("Claim")]) == 50
        assert text_of(out) == "".join(f"Claim {i} holds. " for i in range(50))

    asyncio.run(run())
