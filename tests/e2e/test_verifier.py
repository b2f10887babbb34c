"""A trained verifier through the proxy: `morphguard serve` under uvicorn with a tiny token classifier (made in the
test, tests/verifier_models.py) configured and `detector.name: auto`, the official `openai` client asking the
scripted provider. The verdict carries the spans the model labelled; the model's accuracy is not what this shows."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from morphguard.detectors.verifier import TOKENS_PROMPT
from tests.e2e.conftest import serve
from tests.e2e.fake_provider import ANSWERS
from tests.servers import stop
from tests.verifier_models import save

PASSAGE = "Ibuprofen is contraindicated in the third trimester of pregnancy."
QUESTION = "Can pregnant women take ibuprofen for back pain?"


@pytest.fixture(scope="module")
def verifier_proxy(provider, tmp_path_factory):
    folder = tmp_path_factory.mktemp("verifier_proxy")
    model = save(folder / "model", "tokens", [PASSAGE, QUESTION, TOKENS_PROMPT, "passage", *ANSWERS.values()])
    config = {
        # the judge is the model in a local folder: `auto` runs the verifier check with it
        "judge": {"runtime": "onnx", "model": str(model), "probe": "required"},
        "verifier": {"shape": "tokens", "threads": 1},
        "proxy": {"upstream": {"base_url": provider, "timeout_s": 5}, "stream_mode": "incremental"},
        "policy": {"audit": {"path": str(folder / "audit.db")}},
    }
    base, process = serve(config, folder)
    yield base
    stop(process)


def ask(base: str, model: str, **extra):
    client = openai.OpenAI(base_url=base + "/v1", api_key="sk-client", max_retries=0, timeout=60)
    return client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": QUESTION}],
        extra_body={"morphguard": {"context": [PASSAGE]}}, **extra)


def test_the_verifier_flags_the_tokens_the_context_lacks_as_spans_of_the_verdict(verifier_proxy):
    verdict = ask(verifier_proxy, "hallucinated").model_extra["morphguard"]
    assert verdict["checked"] and verdict["detector"] == "verifier" and verdict["flagged"]
    answer = ANSWERS["hallucinated"]
    flagged = [f for f in verdict["factoids"] if f["score"] >= verdict["threshold"]]
    assert [(f["text"], answer[f["start"]:f["end"]]) for f in flagged] == [("safe throughout",) * 2]

    faithful = ask(verifier_proxy, "faithful").model_extra["morphguard"]
    assert faithful["checked"] and not faithful["flagged"] and faithful["score"] < 0.05


def test_a_stream_checked_as_it_flows_ends_with_the_verifiers_verdict(verifier_proxy):
    body = {"model": "hallucinated", "stream": True, "messages": [{"role": "user", "content": QUESTION}],
            "morphguard": {"context": [PASSAGE]}}
    with httpx.stream("POST", verifier_proxy + "/v1/chat/completions", json=body, timeout=60,
                      headers={"authorization": "Bearer sk-client"}) as response:
        assert response.headers["x-morphguard-stream"] == "incremental"
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
    verdicts = [e["morphguard"] for e in events if "morphguard" in e]
    assert verdicts and verdicts[-1]["detector"] == "verifier" and verdicts[-1]["flagged"]
    assert any(f["text"] == "safe throughout" for f in verdicts[-1]["factoids"])
