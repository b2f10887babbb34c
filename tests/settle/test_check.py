"""Checking an answer within its bounds: the judge calls a check may make, and the budget of time it has."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from morphguard.config import Config
from morphguard.detectors import build_detector
from morphguard.detectors.memo import ignored
from morphguard.models import RagInput
from morphguard.policy.engine import PolicyEngine
from morphguard.settle.check import Checker
from morphguard.settle.values import Answer, CheckOutcome, CheckRequest
from morphguard.store.queue import Entry
from tests.scripted_llm import ScriptedLLM, completion, error
from tests.servers import bound_socket

RAG = RagInput(question="Where is Paris?", passages=["Paris is the capital of France. Lyon is in France too."])


def verdicts(body: dict[str, Any]) -> str:
    asked = re.findall(r"^(\d+)\. ", body["messages"][-1]["content"], re.M)
    return json.dumps({"sentences": [{"id": int(n), "verdict": "SUPPORTED", "phrases": []} for n in asked],
                       "answer": "SUPPORTED"})


def checker(base_url: str, *, on_error: str = "fail_open", budget_s: float | None = None,
            max_judge_calls: int | None = None, concurrency: int = 8) -> Checker:
    cap = {} if max_judge_calls is None else {"max_judge_calls": max_judge_calls}
    config = Config.model_validate({
        "judge": {"model": "openai/scripted", "api_base": base_url, "api_key": "sk-test", "timeout_s": 30,
                  "max_attempts": 1, "concurrency": concurrency},
        "detector": {"name": "sentences", **cap}, "sentences": {"batch": 1},
        "policy": {"profiles": {"general": {"on_error": on_error, "latency_budget_s": budget_s}}}})
    return Checker(build_detector(config), PolicyEngine(config.policy), config)


async def decided(checker: Checker, request: CheckRequest, text: str) -> CheckOutcome:
    """The check of an answer of this text, and policy's decision on what it found."""
    answer = Answer.of_text(text)
    found = await checker.find(request, answer)
    decision = checker.engine.decide(request.profile, request.topic, found.finding, answer.holds())
    return CheckOutcome(decision, found.finding.detection, found.latency_ms)


def request() -> CheckRequest:
    return CheckRequest(body={}, rag=RAG, source="explicit", profile="general", topic="general")


ANSWER = "Paris is the capital of France. Lyon is in France. Nice is in France."  # 3 calls at batch 1


@pytest.mark.parametrize(("on_error", "action"), [("fail_open", "pass"), ("fail_closed", "block")])
def test_a_check_needing_more_judge_calls_than_the_cap_reads_what_fits_and_the_rest_fails_as_judge_call_cap(
        on_error, action):
    with ScriptedLLM(verdicts) as server:
        outcome = asyncio.run(decided(checker(server.base_url, on_error=on_error, max_judge_calls=2), request(),
                                      ANSWER))
        assert len(server.requests) == 2  # the first two sentences; none sent past the cap
    assert (outcome.decision.action, outcome.decision.reason) == (action, f"{on_error}: judge_call_cap")
    assert outcome.detection is not None and outcome.detection.unchecked_from == ANSWER.index("Nice")


def test_a_check_within_the_cap_is_judged_whole():
    with ScriptedLLM(verdicts) as server:
        outcome = asyncio.run(decided(checker(server.base_url, max_judge_calls=3), request(), ANSWER))
        assert len(server.requests) == 3
    assert outcome.detection is not None and outcome.decision.reason is None


class SlowJudge:
    """A judge on a real socket that answers after `delay_s`, counting the calls it is still working on: a call
    whose client has gone (closed its connection) stops counting, as a provider stops generating for it."""

    def __init__(self, delay_s: float, refuse: str | None = None) -> None:
        self.delay_s, self.in_flight, self.started = delay_s, 0, 0
        self.refuse = refuse  # a prompt holding this is refused at once (400), the others answered late
        self.socket = bound_socket()  # the port is ours from here on, whatever else starts meanwhile
        self.port = self.socket.getsockname()[1]
        app = Starlette(routes=[Route("/v1/chat/completions", self._chat, methods=["POST"])])
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))

    async def _chat(self, request: Request) -> JSONResponse:
        body = json.loads(await request.body())
        if self.refuse is not None and self.refuse in body["messages"][-1]["content"]:
            return JSONResponse({"error": {"message": "refused", "type": "invalid_request_error"}}, status_code=400)
        self.in_flight += 1
        self.started += 1
        try:
            deadline = time.monotonic() + self.delay_s
            while time.monotonic() < deadline:
                if await request.is_disconnected():
                    return JSONResponse({}, status_code=499)
                await asyncio.sleep(0.02)
            return JSONResponse(completion(verdicts(body)))
        finally:
            self.in_flight -= 1

    @contextmanager
    def running(self) -> Iterator[SlowJudge]:
        thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True)
        thread.start()
        while not self.server.started:
            time.sleep(0.02)
        try:
            yield self
        finally:
            self.server.should_exit = True
            thread.join(timeout=5)

    async def settled(self) -> int:
        """The calls still in flight once the judge has had time to see a closed connection (asked while the
        client's event loop still runs: closing it would close every connection, abandoned or not)."""
        for _ in range(50):
            if not self.in_flight:
                break
            await asyncio.sleep(0.02)
        return self.in_flight


def test_a_check_whose_judge_call_fails_leaves_none_of_its_other_calls_running():
    with SlowJudge(delay_s=5.0, refuse="Nice").running() as judge:
        guard = checker(f"http://127.0.0.1:{judge.port}/v1")

        async def check_then_count() -> tuple[Any, int]:
            outcome = await decided(guard, request(), ANSWER)  # one call per sentence; the third refused
            return outcome, await judge.settled()

        outcome, still_running = asyncio.run(check_then_count())
        assert outcome.decision.reason == "fail_open: judge_error"
        assert judge.started == 2
        assert still_running == 0


def test_a_check_past_max_text_chars_reads_the_first_sentences_and_fails_the_rest_as_check_too_large():
    config = Config.model_validate({"detector": {"name": "grounding", "max_text_chars": 1000},
                                    "policy": {"profiles": {"general": {"on_error": "fail_closed"}}}})
    guard = Checker(build_detector(config), PolicyEngine(config.policy), config)
    small = asyncio.run(decided(guard, request(), ANSWER))
    assert small.detection is not None
    large = asyncio.run(decided(guard, request(), "Paris is in France. " * 60))
    assert (large.decision.action, large.decision.reason) == ("block", "fail_closed: check_too_large")
    assert large.detection is not None and 500 <= (large.detection.unchecked_from or 0) <= 1000
    invented = asyncio.run(decided(guard, request(), "Paris is in Spain. " + "Paris is in France. " * 60))
    assert (invented.decision.action, invented.decision.flagged) == ("annotate", True)  # caught in what fits
    one = asyncio.run(decided(guard, request(), "Paris " * 400 + "is in France."))  # no sentence fits
    assert one.detection is None and one.decision.reason == "fail_closed: check_too_large"


def test_a_grounding_check_past_its_alignment_bound_reads_the_first_sentences_and_leaves_the_rest_to_on_error():
    config = Config.model_validate({"detector": {"name": "grounding"}})
    guard = Checker(build_detector(config), PolicyEngine(config.policy), config)
    passages = [" ".join(f"Alpha {'beta' if n % 2 else 'gamma'} {n}." for n in range(4_000))]
    hostile = CheckRequest(body={}, rag=RagInput(question="Alpha?", passages=passages), source="explicit",
                           profile="general", topic="general")
    tail = " ".join(["Alpha beta gamma."] * 100)  # each sentence compared with 2,000 context sentences: past the bound
    outcome = asyncio.run(decided(guard, hostile, tail))
    assert outcome.decision.reason == "fail_open: check_too_large" and outcome.decision.unchecked
    assert outcome.detection is not None and 0 < (outcome.detection.unchecked_from or 0) < len(tail)
    assert tail[:outcome.detection.unchecked_from].strip().endswith("gamma.")  # read to a sentence's end
    invented = "Zeta Corporation bought Omega Industries for 9,999 dollars in Berlin. "
    caught = asyncio.run(decided(guard, hostile, invented + tail))
    assert (caught.decision.flagged, caught.decision.reason) == (True, "read in part: check_too_large")
    assert caught.detection is not None and caught.detection.factoids[0].start == 0


class Loopback:
    """The fleet's hand-off in one process: a job goes as JSON to a worker's checker (`detect_for_caller`) and its
    reply comes back as JSON, as through the queue, without the queue."""

    def __init__(self, worker: Checker) -> None:
        self.worker = worker

    async def call(self, entry_id: str, job: dict[str, Any], timeout_s: float) -> dict[str, Any] | None:
        payload = json.loads(json.dumps({**job, "deadline": time.time() + timeout_s}))
        reply = await self.worker.detect_for_caller(Entry("1-0", entry_id, payload, 0, False, "reply"))
        return json.loads(json.dumps(reply))


def test_a_workers_failed_check_charges_the_streams_budget_and_brings_back_the_verdicts_it_got():
    """A stream's check made by a worker whose judge fails at the third sentence: the three calls it made count
    against the stream's budget, and the two verdicts it got are not asked about again by the stream's next check."""
    refusing = True

    def judge(body: dict[str, Any]) -> Any:
        return error(400, "refused") if refusing and "Nice" in body["messages"][-1]["content"] else verdicts(body)

    with ScriptedLLM(judge) as server:
        caller = checker(server.base_url, max_judge_calls=10, concurrency=1)
        caller.pool = Loopback(checker(server.base_url, max_judge_calls=10, concurrency=1))

        async def stream() -> tuple[Any, Any, int]:
            nonlocal refusing
            memo = caller.memo(request())
            failed = await caller.find(request(), Answer.of_text(ANSWER), memo)
            assert memo.budget is not None
            charged = memo.budget.used
            refusing = False
            return failed, await caller.find(request(), Answer.of_text(ANSWER), memo), charged

        failed, passed, charged = asyncio.run(stream())
        assert failed.finding.failed == "judge_error" and passed.finding.detection is not None
        assert charged == 3
        assert ["Nice" in body["messages"][-1]["content"] for body in server.requests] == [False, False, True, True]


def test_a_worker_reads_a_carried_memo_of_an_unknown_shape_as_none_and_still_replies(caplog):
    """A job from a process of another version, its memo's verdicts not a list: the worker leaves them out (saying
    so once), checks the answer and replies, rather than failing without a reply."""
    memo = {"notes": {"sentences": {"verdicts": 7, "wholes": [["x"]]}}, "calls_left": 5}
    job = {"request": request().to_dict(), "answer": ANSWER, "memo": memo}
    ignored.cache_clear()  # said once per process: whatever said it before, this is the first time
    with ScriptedLLM(verdicts) as server, caplog.at_level(logging.WARNING, "morphguard.detectors.memo"):
        worker = checker(server.base_url, max_judge_calls=10)
        entry = Entry("1-0", "r", {"detect": job, "deadline": time.time() + 30}, 0, False, "reply")
        reply = asyncio.run(worker.detect_for_caller(entry))
        again = asyncio.run(worker.detect_for_caller(entry))
    assert "detection" in reply and "detection" in again
    assert reply["memo"]["calls"] == 3  # each sentence asked: nothing read from the malformed notes
    assert len([r for r in caplog.records if "unknown shape" in r.getMessage()]) == 1
