"""The engine that checks a stream as it flows, over in-memory event streams: where it cuts sentences, what it
holds back, what it never lets out, what runs at once, and how it ends when the client or the upstream goes."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pytest

from morphguard.config import ProxySettings
from morphguard.detectors.text import sentences
from morphguard.masking import mask_presented
from morphguard.models import RagInput
from morphguard.policy.record import Released
from morphguard.proxy.stream_modes import stream_mode
from morphguard.settle.incremental import Claim, Closing, Incremental, PrefixCheck
from morphguard.settle.values import Answer, CheckRequest
from tests.passing_checks import Passing
from tests.reads import Reading


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

    def opaque(self, event: Ev) -> bool:
        return event.kind == "opaque"  # answer content that is not text (audio data, an image)

    def marked(self, event: Ev, verdict: dict[str, Any]) -> Ev:
        return replace(event, verdict=verdict)

    def ending(self, sent: Sequence[Ev], closing: Closing) -> list[Ev]:
        self.sent = list(sent)
        if closing.blocks:
            return [Ev(closing.notice, kind="filtered", verdict=closing.verdict)]
        return [Ev(kind="end", verdict=closing.verdict)]


class Judge:
    """Reads each text whole, as a check of the answer does: "FALSE" and "BLOCK" are flagged claims (a claim is
    the sentence holding the word), "BLOCK" ends the stream; each "weak" adds 0.2 to the score and three of them
    are flagged and end the stream, so evidence spread over sentences adds up over the answer. `gates` hold a check
    until the test opens it (by the start of what it reads: "prefix:..." or "whole:..."); what started, finished
    and was cancelled is kept, and the most checks that ran at once."""

    def __init__(self, whole_blocks: bool = False) -> None:
        self.started: list[str] = []
        self.finished: list[str] = []
        self.cancelled: list[str] = []
        self.gates: dict[str, asyncio.Event] = {}
        self.whole_blocks = whole_blocks
        self.running = 0
        self.most_at_once = 0
        self.closed: tuple[str, PrefixCheck, Released] | None = None

    async def _wait(self, name: str) -> None:
        self.started.append(name)
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        try:
            gate = next((g for key, g in self.gates.items() if name.startswith(key)), None)
            if gate is not None:
                await gate.wait()
            await asyncio.sleep(0)
        except asyncio.CancelledError:
            self.cancelled.append(name)
            raise
        finally:
            self.running -= 1
        self.finished.append(name)

    def _check(self, text: str, whole: bool = False) -> PrefixCheck:
        weak = text.count("weak")
        found = tuple(Claim(a, b, 0.9, True) for a, b in sentences(text)
                      if "FALSE" in text[a:b] or "BLOCK" in text[a:b])
        blocks = "BLOCK" in text or weak >= 3 or (whole and self.whole_blocks)
        flagged = bool(found) or blocks
        score = 0.9 if found else round(0.1 + 0.2 * weak, 4)
        return PrefixCheck(flagged=flagged, blocks=blocks, score=score, claims=found, whole=whole)

    async def prefix(self, text: str) -> PrefixCheck:
        await self._wait("prefix:" + text)
        return self._check(text)

    async def whole(self, text: str) -> PrefixCheck:
        await self._wait("whole:" + text)
        return self._check(text, whole=True)

    async def close(self, text: str, deciding: PrefixCheck, released: Released) -> Closing:
        self.closed = (text, deciding, released)
        action = "block" if deciding.blocks else "annotate" if deciding.flagged else "pass"
        return Closing({"action": action}, deciding.blocks, "Withheld.")


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
        # each check reads the answer from its start, up to a finished sentence; the last reads it whole
        assert judge.started[0] == "prefix:Paris is the capital."
        assert all(s.startswith("prefix:Paris is the capital.") for s in judge.started[:-1])
        assert judge.started[-1] == "whole:" + text_of(events)
        last = out[-1].verdict
        assert last is not None and last["action"] == "pass"
        assert [s["start"] for s in last["sentences"]] == [0, 22, 49]  # offsets into the whole answer
        assert judge.closed is not None and judge.closed[1].whole
        assert judge.closed[2] == Released(chars=len(text_of(events)), score=0.1, flagged=False)

    asyncio.run(run())


def test_evidence_that_adds_up_over_sentences_ends_the_stream_before_the_sentence_that_tips_it():
    # each sentence alone scores 0.3 and passes; two score 0.5, three 0.7 and end the stream: the third sentence
    # never leaves, and what left is a prefix that passed the very check that blocked
    async def run() -> None:
        judge, upstream = Judge(), Upstream()
        first, second = "Opens at nine, weak. ", "Costs ten, weak. "
        upstream.push(Ev(kind="role"), *deltas(first, second, "Parks free, weak. ", "More."), Ev(kind="finish"),
                      None)
        out = await collect(Incremental(Plain(), judge), upstream)
        assert text_of(out) == first + second
        assert "Parks" not in "".join(e.text for e in out)
        assert out[-1].kind == "filtered" and out[-1].verdict is not None and out[-1].verdict["action"] == "block"
        assert judge.closed is not None
        _, deciding, released = judge.closed
        assert deciding.blocks and deciding.score == 0.7
        assert released == Released(chars=len(first + second), score=0.5, flagged=False)  # what went passed
        assert upstream.closed and not any(s.startswith("whole:") for s in judge.started)

    asyncio.run(run())


def test_a_prefix_is_held_until_its_check_passes_and_the_upstream_is_read_meanwhile():
    async def run() -> None:
        judge, upstream = Judge(), Upstream()
        judge.gates["prefix:One is true."] = asyncio.Event()
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
        assert text_of(upstream.read) == "One is true. Two is true. Three"  # the upstream kept being read
        assert judge.started == ["prefix:One is true."]  # one check at a time
        judge.gates["prefix:One is true."].set()
        await settle()
        # one passed: its first event went, not the one that starts sentence two; then the prefix up to two was
        # checked and went, not the event that starts sentence three. The event that lets the last of a sentence
        # out carries its verdict, and that of the prefix it passed with
        assert judge.started == ["prefix:One is true.", "prefix:One is true. Two is true."]
        assert text_of(out) == "One is true. Two"
        assert [e.verdict for e in out[1:]] == [
            None,
            {"sentences": [{"start": 0, "end": 12, "flagged": False}],  # two is not out whole yet
             "passed": {"end": 25, "flagged": False, "score": 0.1}}]
        upstream.push(Ev(kind="finish"), None)
        await task
        assert text_of(out) == "One is true. Two is true. Three"
        assert [e.kind for e in out[-2:]] == ["finish", "end"]

    asyncio.run(run())


def test_sentences_finished_while_a_prefix_is_checked_are_checked_together_by_one_next_check():
    async def run() -> None:
        judge, upstream = Judge(), Upstream()
        judge.gates["prefix:One."] = asyncio.Event()
        task = asyncio.create_task(collect(Incremental(Plain(), judge), upstream))
        upstream.push(*deltas("One. ", "Two. ", "Three. ", "Four. ", "Five. ", "Six"))
        await settle()
        assert judge.started == ["prefix:One."]
        judge.gates["prefix:One."].set()
        await settle()
        assert judge.started == ["prefix:One.", "prefix:One. Two. Three. Four. Five."]  # coalesced: one check
        upstream.push(None)
        out = await task
        assert text_of(out) == "One. Two. Three. Four. Five. Six"
        assert judge.most_at_once == 1 and len(judge.started) == 3

    asyncio.run(run())


def test_a_blocking_prefix_never_leaves_and_the_stream_ends_with_the_content_filter_ending():
    async def run() -> None:
        judge, upstream = Judge(), Upstream()
        judge.gates["prefix:Fine start. This is BLOCK"] = asyncio.Event()
        task = asyncio.create_task(collect(Incremental(Plain(), judge), upstream))
        upstream.push(Ev(kind="role"), *deltas("Fine start. ", "This is BL", "OCK material. More", " text. And"))
        await settle()
        assert judge.started == ["prefix:Fine start.", "prefix:Fine start. This is BLOCK material."]
        judge.gates["prefix:Fine start. This is BLOCK"].set()
        out = await task
        assert text_of(out) == "Fine start. "
        assert "BLOCK" not in "".join(e.text for e in out)
        assert [e.kind for e in out][-1] == "filtered" and out[-1].text == "Withheld."
        verdict = out[-1].verdict
        assert verdict is not None and verdict["action"] == "block"
        assert verdict["sentences"] == [{"start": 0, "end": 11, "flagged": False},
                                        {"start": 12, "end": 35, "flagged": True, "score": 0.9}]
        assert judge.closed is not None and not judge.closed[1].whole
        assert judge.closed[2] == Released(chars=12, score=0.1, flagged=False)
        assert upstream.closed  # the upstream is no longer read

    asyncio.run(run())


def test_when_the_whole_answer_blocks_what_the_prefix_check_under_way_passes_still_goes_out():
    async def run() -> None:
        judge, upstream = Judge(whole_blocks=True), Upstream()
        judge.gates["prefix:"] = asyncio.Event()
        task = asyncio.create_task(collect(Incremental(Plain(), judge), upstream))
        upstream.push(*deltas("First one. ", "Last one"), Ev(kind="finish"), None)
        await settle()
        # the upstream ended: the whole answer is checked beside the prefix check under way, and blocks first
        assert judge.started == ["prefix:First one.", "whole:First one. Last one"]
        assert judge.finished == ["whole:First one. Last one"]
        judge.gates["prefix:"].set()
        out = await task
        assert text_of(out) == "First one. "  # the prefix passed: it goes; the last sentence is withheld
        assert out[-1].kind == "filtered" and out[-1].verdict is not None and out[-1].verdict["action"] == "block"
        assert [e.kind for e in out].count("finish") == 0
        assert judge.closed is not None and judge.closed[1].whole
        assert judge.closed[2] == Released(chars=len("First one. "), score=0.1, flagged=False)

    asyncio.run(run())


def test_when_the_whole_answer_passes_everything_goes_out_without_waiting_for_the_prefix_check():
    async def run() -> None:
        judge, upstream = Judge(), Upstream()
        judge.gates["prefix:"] = asyncio.Event()  # never opened
        upstream.push(*deltas("First one. ", "Last one"), Ev(kind="finish"), None)
        out = await collect(Incremental(Plain(), judge), upstream)
        assert text_of(out) == "First one. Last one" and [e.kind for e in out][-2:] == ["finish", "end"]
        assert judge.cancelled == ["prefix:First one."]

    asyncio.run(run())


def test_a_whole_answer_block_withholds_every_sentence_not_yet_passed():
    async def run() -> None:
        judge, upstream = Judge(), Upstream()
        upstream.push(*deltas("One weak. ", "Two weak. ", "Three weak"), Ev(kind="finish"), None)
        out = await collect(Incremental(Plain(), judge), upstream)
        assert text_of(out) == "One weak. Two weak. "  # the last sentence tips it, and is not yet finished mid-way
        assert out[-1].kind == "filtered"
        assert judge.closed is not None and judge.closed[1].whole and judge.closed[1].score == 0.7
        assert judge.closed[2] == Released(chars=len("One weak. Two weak. "), score=0.5, flagged=False)

    asyncio.run(run())


def test_a_window_waits_for_that_many_new_sentences_before_a_prefix_check():
    async def run() -> None:
        judge, upstream = Judge(), Upstream()
        task = asyncio.create_task(collect(Incremental(Plain(), judge, window=2), upstream))
        upstream.push(*deltas("A one. "))
        await settle()
        assert judge.started == []
        upstream.push(*deltas("B two. ", "C three. ", "D four"), None)
        out = await task
        assert judge.started[0] == "prefix:A one. B two."
        assert text_of(out) == "A one. B two. C three. D four"

    asyncio.run(run())


def test_after_the_first_check_a_check_takes_whole_judge_calls_of_sentences_until_one_has_waited_too_long():
    async def run() -> None:
        judge, upstream = Judge(), Upstream()
        judge.gates["prefix:A one."] = gate = asyncio.Event()
        task = asyncio.create_task(collect(Incremental(Plain(), judge, fill=2, hold_s=0.3), upstream))
        upstream.push(*deltas("A one. ", "B two. ", "C three. ", "D four. ", "E five. ", "F six. "))
        await settle()
        assert judge.started == ["prefix:A one."]  # the first check at once, for the first token
        gate.set()
        await settle()
        assert judge.started[1] == "prefix:A one. B two. C three. D four. E five."  # two full calls; F waits
        await asyncio.sleep(0.5)
        assert judge.started[2:] == ["prefix:A one. B two. C three. D four. E five. F six."]  # F waited its hold_s
        upstream.push(None)
        out = await task
        assert text_of(out) == "A one. B two. C three. D four. E five. F six. "

    asyncio.run(run())


def test_flagged_sentences_under_a_non_blocking_rule_go_out_with_their_verdicts():
    async def run() -> None:
        judge, upstream = Judge(), Upstream()
        judge.gates["prefix:"] = asyncio.Event()
        task = asyncio.create_task(collect(Incremental(Plain(), judge), upstream))
        upstream.push(*deltas("This is FALSE. ", "This is fine. ", "End"))
        await settle()
        judge.gates["prefix:"].set()
        upstream.push(Ev(kind="finish"), None)
        out = await task
        assert text_of(out) == "This is FALSE. This is fine. End"
        marked = [e.verdict for e in out if e.verdict is not None]
        assert marked[0] == {"sentences": [{"start": 0, "end": 14, "flagged": True, "score": 0.9}],
                             "passed": {"end": 14, "flagged": True, "score": 0.9}}
        assert marked[-1] is not None and [s["flagged"] for s in marked[-1]["sentences"]] == [True, False, False]

    asyncio.run(run())


def test_a_client_that_leaves_cancels_the_checks_and_stops_reading_the_upstream():
    async def run() -> None:
        judge, upstream = Judge(), Upstream()
        judge.gates["prefix:One."] = asyncio.Event()
        stream = Incremental(Plain(), judge).run(upstream.events())
        upstream.push(Ev(kind="role"), *deltas("One. Two. ", "Three"))
        first = await anext(stream)
        assert first.kind == "role"
        pulling = asyncio.ensure_future(anext(stream))  # the server asks for more; the text waits for its check
        await settle()
        assert judge.started == ["prefix:One. Two."] and not pulling.done()
        pulling.cancel()  # what Starlette does when the client goes
        with pytest.raises(asyncio.CancelledError):
            await pulling
        await stream.aclose()
        assert "prefix:One. Two." in judge.cancelled
        assert upstream.closed

    asyncio.run(run())


def test_a_cancelled_response_task_cancels_the_checks():
    async def run() -> None:
        judge, upstream = Judge(), Upstream()
        judge.gates["prefix:One."] = asyncio.Event()
        task = asyncio.create_task(collect(Incremental(Plain(), judge), upstream))
        upstream.push(*deltas("One. ", "Two"))
        await settle()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert "prefix:One." in judge.cancelled and upstream.closed

    asyncio.run(run())


def test_an_upstream_error_mid_stream_is_raised_and_no_unchecked_text_leaves():
    async def run() -> None:
        judge, upstream = Judge(), Upstream()
        judge.gates["prefix:One. Two."] = asyncio.Event()
        out: list[Ev] = []
        upstream.push(*deltas("One. ", "Two. ", "Three"))
        engine = Incremental(Plain(), judge)

        async def consume() -> None:
            async for event in engine.run(upstream.events()):
                out.append(event)

        task = asyncio.create_task(consume())
        await settle()
        assert judge.started == ["prefix:One.", "prefix:One. Two."]
        upstream.push(ConnectionResetError("dropped"))
        with pytest.raises(ConnectionResetError):
            await task
        assert text_of(out) == "One. "
        assert "prefix:One. Two." in judge.cancelled and judge.closed is None

    asyncio.run(run())


class Halt(BaseException):
    """Not an error: a signal of the kind a process ends by (as KeyboardInterrupt and SystemExit are)."""


class FailingOnCancel(Judge):
    """A prefix check that never finishes, and raises `failure` when it is cancelled (a check's clean-up that fails)."""

    def __init__(self, failure: BaseException) -> None:
        super().__init__()
        self.failure = failure

    async def prefix(self, text: str) -> PrefixCheck:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise self.failure from None
        raise AssertionError("unreachable")


def test_when_two_activities_fail_the_first_error_is_raised_and_the_other_logged_without_secrets(caplog):
    async def run() -> None:
        mask_presented(["sk-client-0123456789"])
        judge, upstream = FailingOnCancel(RuntimeError("clean-up failed for sk-client-0123456789")), Upstream()
        upstream.push(*deltas("One. ", "Two"))
        task = asyncio.create_task(collect(Incremental(Plain(), judge), upstream))
        await settle()
        upstream.push(ConnectionResetError("dropped"))
        with pytest.raises(ConnectionResetError):
            await task

    with caplog.at_level(logging.WARNING, "morphguard.settle.incremental"):
        asyncio.run(run())
    said = [r.getMessage() for r in caplog.records if r.name == "morphguard.settle.incremental"]
    assert said == ["stream: RuntimeError also failed while the stream ended: clean-up failed for [masked]"]


def test_a_signal_raised_while_the_work_winds_down_after_the_client_left_is_not_swallowed():
    async def run() -> None:
        upstream = Upstream()
        stream = Incremental(Plain(), FailingOnCancel(Halt())).run(upstream.events())
        upstream.push(*deltas("One. ", "Two"))
        pulling = asyncio.ensure_future(anext(stream))
        await settle()
        pulling.cancel()  # the client goes; the check, cancelled, raises what is not an error
        with pytest.raises(Halt):
            await pulling

    asyncio.run(run())


def test_a_check_that_fails_unexpectedly_ends_the_stream_with_its_error():
    class Broken(Judge):
        async def prefix(self, text: str) -> PrefixCheck:
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


def test_one_stream_runs_one_prefix_check_at_a_time_however_many_sentences_come():
    async def run() -> None:
        judge, upstream = Judge(), Upstream()
        gate = asyncio.Event()
        judge.gates["prefix:Claim 0 holds."] = gate
        upstream.push(*deltas(*(f"Claim {i} holds. " for i in range(50))))
        engine = Incremental(Plain(), judge)
        task = asyncio.ensure_future(collect(engine, upstream))
        for _ in range(10):
            await settle()
        assert judge.started == ["prefix:Claim 0 holds."]  # one check under way...
        assert len(upstream.read) == 50  # ...and the upstream is read meanwhile
        gate.set()
        await settle()
        upstream.push(None)
        out = await task
        assert judge.most_at_once == 1
        # the first sentence, the 49 others coalesced, and the whole answer
        assert len(judge.started) == 3
        assert text_of(out) == "".join(f"Claim {i} holds. " for i in range(50))

    asyncio.run(run())


VISIT_CONTEXT = ("The museum opens at nine on weekdays. The entry ticket is twenty euros. "
                 "Parking is behind the building.")


@pytest.fixture
def guard(tmp_path):
    from morphguard.config import Config
    from morphguard.detectors import build_detector
    from morphguard.policy.engine import PolicyEngine
    from morphguard.settle.guard import build_guard

    config = Config.model_validate({
        "detector": {"name": "grounding"},
        "policy": {"audit": {"path": str(tmp_path / "audit.db")},
                   "profiles": {"general": {"action": "block", "topics": {}}}}})
    built = build_guard(config, build_detector(config), PolicyEngine(config.policy))
    yield built
    asyncio.run(built.close())


class Visit:
    """A stream about the visit checked by the guard: its checks, its upstream and its run; `whole(text)` makes the
    whole answer of the text the run read (by default that text alone)."""

    def __init__(self, guard, whole=None) -> None:
        request = CheckRequest(body={}, rag=RagInput(question="When and how much?", passages=[VISIT_CONTEXT]),
                               source="explicit", profile="general", topic="general")
        streaming = guard.stream(request)
        self.engine = streaming.flowing(Plain(), lambda: (whole or Answer.of_text)(self.engine.text))
        self.checks = streaming.checks
        self.upstream = Upstream()


def test_the_guard_records_a_block_of_the_withheld_rest_and_the_verdict_of_what_went_out(guard):
    # `grounding` sums its evidence: each sentence passes alone (0.22 < 0.3), the first two together do not (0.39)
    async def run() -> list[Ev]:
        visit = Visit(guard)
        checks, upstream = visit.checks, visit.upstream
        upstream.push(*deltas("The museum opens at nine on weekdays, reliably. ", "The entry ticket is twenty ",
                              "euros, cash. ", "Parking is behind the building, free."), Ev(kind="finish"), None)
        out = await collect(visit.engine, upstream)
        assert checks.record is not None
        record = checks.record
        assert (record.action, record.flagged) == ("block", True) and record.score is not None
        assert record.score >= 0.3 > (record.released_score or 1.0)
        assert (record.released_chars, record.released_flagged) == (len(text_of(out)), False)
        assert out[-1].verdict is not None and out[-1].verdict["released_chars"] == record.released_chars
        return out

    out = asyncio.run(run())
    assert text_of(out) == "The museum opens at nine on weekdays, reliably. "


def test_the_whole_answer_that_passed_as_a_prefix_keeps_that_verdict_without_a_second_check(guard):
    calls: list[str] = []
    find = guard._checker.find

    async def counted(request: CheckRequest, answer: Answer, memo: Any = None) -> Any:
        calls.append(guard._checker.answer_text(answer))
        return await find(request, answer, memo)

    guard._checker.find = counted

    async def run() -> None:
        visit = Visit(guard)
        checks, upstream, engine = visit.checks, visit.upstream, visit.engine
        answer = "The museum opens at nine on weekdays. "
        upstream.push(*deltas(answer))
        task = asyncio.ensure_future(collect(engine, upstream))
        while not engine.checked:
            await asyncio.sleep(0.01)
        upstream.push(Ev(kind="finish"), None)
        out = await task
        assert text_of(out) == answer and out[-1].kind == "end"
        assert calls == [answer.strip()]  # the whole answer is that prefix: its verdict stands
        assert checks.record is not None and checks.record.action == "pass"
        assert checks.record.released_chars == len(answer)

    asyncio.run(run())


@pytest.mark.parametrize("whole_blocks", [True, False])
def test_an_event_the_check_cannot_read_waits_for_the_verdict_of_the_whole_answer(whole_blocks):
    """Audio data or an image between passing sentences: never released on a prefix's word, so a block of the whole
    answer withholds it; when the whole answer passes, it goes out in its place. Framing goes as it comes."""
    async def run() -> None:
        judge, upstream = Judge(whole_blocks=whole_blocks), Upstream()
        gate = asyncio.Event()
        judge.gates["whole:"] = gate
        upstream.push(Ev(kind="role"), *deltas("First holds. "), Ev("DATA", kind="opaque"),
                      *deltas("Second holds. "))
        engine = Incremental(Plain(), judge)
        task = asyncio.ensure_future(collect(engine, upstream))
        for _ in range(10):
            await settle()
        assert "prefix:First holds." in judge.finished  # the text before it passed...
        upstream.push(None)
        for _ in range(10):
            await settle()
        assert engine.checked and not task.done()  # ...and the event waits with the whole answer's check
        gate.set()
        out = await task
        kinds = [e.kind for e in out]
        if whole_blocks:
            assert "opaque" not in kinds and out[-1].kind == "filtered"
            assert kinds[0] == "role" and text_of(out).startswith("First holds.")
        else:
            assert kinds == ["role", "delta", "opaque", "delta", "end"]

    asyncio.run(run())


def test_a_whole_answer_whose_text_passed_as_a_prefix_is_still_decided_on_what_else_it_holds(tmp_path):
    """Its text is the prefix that passed, so the check is not run again; but it holds audio the check cannot read,
    which this policy blocks: the verdict is a block, not the prefix's pass."""
    from morphguard.config import Config
    from morphguard.detectors import build_detector
    from morphguard.policy.engine import PolicyEngine
    from morphguard.proxy.dialects.base import as_completion
    from morphguard.settle.guard import build_guard

    config = Config.model_validate({
        "detector": {"name": "grounding"},
        "policy": {"audit": {"path": str(tmp_path / "audit.db")}, "unreadable_output": "block",
                   "profiles": {"general": {"action": "block", "topics": {}}}}})
    guard = build_guard(config, build_detector(config), PolicyEngine(config.policy))

    def with_audio(text: str) -> Answer:
        return Answer(as_completion({"role": "assistant", "content": text, "audio": {"id": "a", "data": "UklGRg=="}}))

    async def run() -> None:
        visit = Visit(guard, with_audio)
        checks, upstream, engine = visit.checks, visit.upstream, visit.engine
        answer = "The museum opens at nine on weekdays. "
        upstream.push(*deltas(answer))
        task = asyncio.ensure_future(collect(engine, upstream))
        while not engine.checked:
            await asyncio.sleep(0.01)
        upstream.push(Ev(kind="finish"), None)
        out = await task
        assert out[-1].kind == "filtered"
        assert checks.record is not None and checks.record.action == "block"
        assert "unreadable_output: audio" in (checks.record.reason or "")
        await guard.close()

    asyncio.run(run())


def test_a_stream_is_cut_into_sentences_reading_its_text_about_once_however_many_checks_pass_it(monkeypatch):
    """A word an event and a check passing each sentence as it finishes: cutting the stream and giving each sentence
    let out its verdict read each character about once, not the prefix again at each event or check."""
    from morphguard.detectors import text

    answer = " ".join(f"Claim {i} holds, e.g. 3.5 kg (\"net\")." for i in range(300))
    said = sentences(answer)
    counts = {"split": 0}
    monkeypatch.setattr(text, "_SENTENCE_END", Reading(text._SENTENCE_END, counts, "split"))
    engine = Incremental(Plain(), Passing())

    async def run() -> list[Ev]:
        upstream = Upstream()
        upstream.push(*deltas(*re.findall(r"\S+\s*", answer)), None)
        return await collect(engine, upstream)

    out = asyncio.run(run())
    assert text_of(out) == answer and len(out[-1].verdict["sentences"]) == len(said)
    assert len(engine.checked) >= 100  # many checks...
    # ...and each character read about three times: as it comes, for the verdicts of the sentences each check lets
    # out, and for those of the whole answer at the end
    assert counts["split"] <= 3.5 * len(answer)
