"""The `sentences` check against a scripted judge on a real loopback socket: what it sends, from which thread
its text work runs, and how many calls a check may make."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from typing import Any

import pytest

from morphguard.config import Config
from morphguard.detectors import build_detector, sentences
from morphguard.errors import JudgeCallCapError
from morphguard.llm.client import call_budget
from morphguard.models import RagInput
from tests.scripted_llm import ScriptedLLM

RAG = RagInput(question="Where is Paris?", passages=["Paris is the capital of France. Lyon is in France too."])


def verdicts(body: dict[str, Any]) -> str:
    """Every numbered sentence of the prompt SUPPORTED, and the answer too."""
    asked = re.findall(r"^(\d+)\. ", body["messages"][-1]["content"], re.M)
    return json.dumps({"sentences": [{"id": int(n), "verdict": "SUPPORTED", "phrases": []} for n in asked],
                       "answer": "SUPPORTED"})


def detector(server: ScriptedLLM, **settings: object):
    config = Config.model_validate({
        "judge": {"model": "openai/scripted", "api_base": server.base_url, "api_key": "sk-test", "timeout_s": 5,
                  "max_attempts": 1},
        "detector": {"name": "sentences"}, "sentences": {"batch": 2, **settings}})
    return build_detector(config)


def test_the_text_work_of_a_check_runs_off_the_event_loop(monkeypatch):
    """Prompts (the focused context of every batch) and the spans of the verdicts grow with the answer and the
    context: none of it may run on the loop, where it would stall every other request."""
    threads: dict[str, set[int]] = {"prompt": set(), "spans": set()}
    render, factoids = sentences.render, sentences._factoids

    def rendered(*args: Any, **kwargs: Any) -> str:
        threads["prompt"].add(threading.get_ident())
        return render(*args, **kwargs)

    def pointed(*args: Any, **kwargs: Any) -> Any:
        threads["spans"].add(threading.get_ident())
        return factoids(*args, **kwargs)

    monkeypatch.setattr(sentences, "render", rendered)
    monkeypatch.setattr(sentences, "_factoids", pointed)
    answer = "Paris is the capital of France. Lyon is in France. Nice is in Italy."
    with ScriptedLLM(verdicts) as server:
        check = detector(server, context_budget=1000)

        async def run() -> tuple[int, Any]:
            return threading.get_ident(), await check.detect(RAG, answer)

        loop_thread, detection = asyncio.run(run())
    assert len(server.requests) == 2 and detection.settings["judged"] == 3
    assert threads["prompt"] and threads["spans"]
    assert loop_thread not in threads["prompt"] | threads["spans"]


def test_a_check_past_its_judge_call_budget_fails_before_sending_any():
    answer = " ".join(f"Paris is the capital of France number {i}." for i in range(5))  # 3 batches of 2
    with ScriptedLLM(verdicts) as server:
        check = detector(server)

        async def run(limit: int) -> Any:
            with call_budget(limit):
                return await check.detect(RAG, answer)

        with pytest.raises(JudgeCallCapError, match="needs 3 judge calls"):
            asyncio.run(run(2))
        assert server.requests == []
        assert asyncio.run(run(3)).settings["calls"] == 3
    assert len(server.requests) == 3
