"""Traces reach a real OTLP backend: Arize Phoenix (from PyPI) as a process on loopback, read back through
Phoenix's own REST API. Phoenix lives in its own virtualenv (`.venv-phoenix`, made by `.ci/run`), since
its dependency set is large and independent of ours."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import httpx
import openai
import pytest

from tests.e2e.conftest import ROOT, free_port, stop
from tests.scripted_llm import sentences_score

FLAGGED = pytest.approx(sentences_score(whole=True, sentence=True), abs=1e-4)  # the scripted judge: both UNSUPPORTED

pytestmark = pytest.mark.slow

PASSAGE = "Ibuprofen is contraindicated in the third trimester of pregnancy."


def phoenix_binary() -> str | None:
    configured = os.environ.get("MORPHGUARD_PHOENIX")
    local = ROOT / ".venv-phoenix" / "bin" / "phoenix"
    return configured or (str(local) if local.exists() else shutil.which("phoenix"))


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory):
    binary = phoenix_binary()
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("Arize Phoenix is not installed (.ci/run puts it in .venv-phoenix)")
        pytest.skip("Arize Phoenix not installed: "
                    "python3 -m venv .venv-phoenix && .venv-phoenix/bin/pip install arize-phoenix")
    folder = tmp_path_factory.mktemp("phoenix")
    port = free_port()
    env = {**os.environ, "PHOENIX_WORKING_DIR": str(folder), "PHOENIX_PORT": str(port),
           "PHOENIX_GRPC_PORT": str(free_port()), "PHOENIX_HOST": "127.0.0.1"}
    log = open(folder / "phoenix.log", "wb")
    process = subprocess.Popen([binary, "serve"], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=folder)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 240
    while True:
        assert process.poll() is None, (folder / "phoenix.log").read_text()[-3000:]
        try:
            if httpx.get(base + "/healthz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "Phoenix did not start"
        time.sleep(0.5)
    yield base
    stop(process)


def spans(phoenix: str, project: str = "default", **query) -> list[dict]:
    response = httpx.get(f"{phoenix}/v1/projects/{project}/spans/otlpv1", params={"limit": 1000, **query},
                         timeout=10)
    if response.status_code == 404 and project != "default":
        return []  # Phoenix makes a project when its first span is in: none yet
    response.raise_for_status()
    return response.json()["data"]


def attributes(span: dict) -> dict:
    out = {}
    for item in span.get("attributes") or []:
        out[item["key"]] = next((v for v in item["value"].values() if v is not None), None)
    return out


def test_the_guardrail_span_and_its_evaluation_are_found_in_phoenix(phoenix, proxy_factory):
    proxy = proxy_factory(telemetry={"exporter": "otlp-http", "endpoint": phoenix, "openinference": True,
                                     "service_name": "morphguard-e2e"})
    client = openai.OpenAI(base_url=proxy + "/v1", api_key="sk-client", max_retries=0, timeout=60)
    completion = client.chat.completions.create(
        model="hallucinated", messages=[{"role": "user", "content": "Can pregnant women take ibuprofen?"}],
        extra_body={"morphguard": {"context": PASSAGE}})
    verdict = completion.model_extra["morphguard"]
    assert verdict["flagged"] and verdict["trace_id"]

    deadline = time.monotonic() + 60  # the batch exporter sends within a second; Phoenix ingests asynchronously
    found: list[dict] = []
    while not found and time.monotonic() < deadline:
        found = spans(phoenix, name="apply_guardrail morphguard", trace_id=verdict["trace_id"])
        time.sleep(0.5)
    assert found, "no guardrail span reached Phoenix"
    guard = attributes(found[0])
    assert guard["gen_ai.operation.name"] == "apply_guardrail" and guard["openinference.span.kind"] == "GUARDRAIL"
    assert float(guard["morphguard.score"]) == FLAGGED and guard["morphguard.topic"] == "pregnancy"
    assert guard["evaluation.label"] == "hallucinated"

    deadline = time.monotonic() + 30
    chat: list[dict] = []
    while not chat and time.monotonic() < deadline:
        chat = spans(phoenix, name="chat hallucinated", trace_id=verdict["trace_id"])
        time.sleep(0.5)
    (evaluation,) = [e for e in chat[0].get("events") or [] if e["name"] == "gen_ai.evaluation.result"]
    event = attributes(evaluation)
    assert event["gen_ai.evaluation.name"] == "hallucination"
    assert float(event["gen_ai.evaluation.score.value"]) == FLAGGED
    assert found[0]["parent_span_id"] == chat[0]["span_id"]


def test_verdicts_become_span_annotations_in_the_configured_project(phoenix, proxy_factory):
    proxy = proxy_factory(telemetry={"exporter": "otlp-http", "endpoint": phoenix, "project": "clinic-rag",
                                     "annotations": {"url": phoenix, "delay_s": 1}})
    client = openai.OpenAI(base_url=proxy + "/v1", api_key="sk-client", max_retries=0, timeout=60)
    completion = client.chat.completions.create(
        model="hallucinated", messages=[{"role": "user", "content": "Can pregnant women take ibuprofen?"}],
        extra_body={"morphguard": {"context": PASSAGE}})
    trace_id = completion.model_extra["morphguard"]["trace_id"]
    deadline = time.monotonic() + 60
    chat: list[dict] = []
    while not chat and time.monotonic() < deadline:  # the project comes from the config, not "default"
        chat = spans(phoenix, "clinic-rag", name="chat hallucinated", trace_id=trace_id)
        time.sleep(0.5)
    assert chat and not spans(phoenix, name="chat hallucinated", trace_id=trace_id)
    found: list[dict] = []
    while not found and time.monotonic() < deadline:
        response = httpx.get(f"{phoenix}/v1/projects/clinic-rag/span_annotations",
                             params={"span_ids": chat[0]["span_id"]}, timeout=10)
        found = response.json().get("data", []) if response.status_code == 200 else []
        time.sleep(0.5)
    assert found, "no annotation reached Phoenix"
    (annotation,) = found
    assert annotation["name"] == "hallucination" and annotation["annotator_kind"] == "LLM"
    assert annotation["result"]["label"] == "hallucinated" and annotation["result"]["score"] == FLAGGED
