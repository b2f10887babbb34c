"""A served verifier against loopback fakes of Text Embeddings Inference's `/predict` and vLLM's `/classify` and
`/score` (tests/llm/fake_verifiers.py), through the verifier check: the documented requests, the replies read by
label, retries, timeouts, the places taken at once and the check's call cap. What these cannot show: the real
servers' models and limits."""

from __future__ import annotations

import asyncio
import sys
from types import SimpleNamespace

import httpx
import pytest

from morphguard.config import Config
from morphguard.detectors import build_detector
from morphguard.detectors.registry import resolve
from morphguard.detectors.verifier import build_verifier
from morphguard.errors import JudgeCallCapError, LLMError, LLMTimeoutError, MorphguardError
from morphguard.llm.client import call_budget
from morphguard.models import RagInput
from tests.e2e.conftest import start
from tests.servers import free_port, stop

PASSAGE = "Ibuprofen is contraindicated in the third trimester of pregnancy."
FAITHFUL = "Ibuprofen is contraindicated in the third trimester."
WRONG = "Ibuprofen is safe throughout pregnancy."
TEMPLATE = "Premise: {premise} Hypothesis: {hypothesis}"
RUNTIMES = {
    "tei": {"runtime": "tei", "label": "entailment", "path": "/tei"},
    "tei-template": {"runtime": "tei", "label": "entailment", "path": "/tei", "template": TEMPLATE},
    "vllm-classify": {"runtime": "vllm-classify", "label": "1", "path": "/vllm", "template": TEMPLATE},
    "vllm-score": {"runtime": "vllm-score", "path": "/vllm"},
}
JUDGE_KEYS = {"model", "runtime", "max_attempts", "timeout_s", "probe", "concurrency"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("verifiers") / "fake.log"
    process = start([sys.executable, "-m", "tests.llm.fake_verifiers", str(port)],
                    f"http://127.0.0.1:{port}/_seen", log)
    yield f"http://127.0.0.1:{port}"
    stop(process)


@pytest.fixture
def fake(server):
    httpx.post(server + "/_reset")
    return server


def seen(server: str) -> dict:
    return httpx.get(server + "/_seen").json()


def served(server: str, name: str = "tei", **settings: object) -> Config:
    """A config whose judge is the verifier `name` at the fake `server`; judge keys go to `judge`, the rest to
    `verifier`."""
    chosen = {k: v for k, v in RUNTIMES[name].items() if k != "path"} | settings
    judge = {"model": "tiny-verifier", "api_base": server + RUNTIMES[name]["path"], "max_attempts": 2,
             "timeout_s": 2} | {k: chosen.pop(k) for k in list(chosen) if k in JUDGE_KEYS}
    return Config.model_validate({"judge": judge, "verifier": chosen})


def detector(server: str, name: str = "tei", **settings: object):
    return build_detector(served(server, name, **settings))


def run(found, answer: str = f"{FAITHFUL} {WRONG}", cap: int | None = None):
    async def checked():
        with call_budget(cap):
            return await found.detect(RagInput(question="Can pregnant women take it?", passages=[PASSAGE]), answer)
    return asyncio.run(checked())


@pytest.mark.parametrize("name", RUNTIMES)
def test_each_server_scores_each_sentence_by_its_documented_api(fake, name):
    found = run(detector(fake, name))
    faithful, wrong = found.factoids
    assert faithful.label == "supported" and faithful.score == pytest.approx(0.12)
    assert wrong.label == "unsupported" and wrong.score == pytest.approx(0.88)
    assert found.flagged and "window 1 of 1" in wrong.reason and "tiny-verifier" in wrong.reason
    requests = seen(fake)["requests"]
    assert len(requests) == (2 if name == "tei-template" else 1)  # TEI reads two lone texts as a pair
    body = requests[-1]["body"]
    if name == "tei":
        assert body == {"inputs": [[PASSAGE, FAITHFUL], [PASSAGE, WRONG]], "truncate": True}
    elif name == "tei-template":
        assert body["inputs"] == f"Premise: {PASSAGE} Hypothesis: {WRONG}"
    elif name == "vllm-classify":
        assert body["model"] == "tiny-verifier" and len(body["input"]) == 2 and body["truncate_prompt_tokens"] == 512
    else:
        assert body["text_1"] == [PASSAGE, PASSAGE] and body["text_2"] == [FAITHFUL, WRONG]


def test_a_single_sequence_and_lone_texts_in_twos_go_as_tei_reads_them(fake):
    run(detector(fake, "tei"), FAITHFUL)
    assert seen(fake)["requests"][0]["body"]["inputs"] == [PASSAGE, FAITHFUL]  # one pair
    httpx.post(fake + "/_reset")
    found = run(detector(fake, "tei-template", batch=2))  # two lone texts would read as one pair: sent apart
    assert [f.label for f in found.factoids] == ["supported", "unsupported"]
    assert [type(r["body"]["inputs"]) for r in seen(fake)["requests"]] == [str, str]


def test_batches_go_out_together_within_the_places_allowed(fake):
    answer = " ".join([FAITHFUL, WRONG] * 3)
    found = run(detector(fake, "vllm-score", batch=1, concurrency=2), answer)
    assert found.cost.llm_calls == 6 and len(seen(fake)["requests"]) == 6
    assert seen(fake)["most_in_flight"] == 2
    httpx.post(fake + "/_reset")
    run(detector(fake, "vllm-score", batch=1, concurrency=1), answer)
    assert seen(fake)["most_in_flight"] == 1


def test_a_server_error_is_tried_again_and_a_refusal_is_not(fake):
    httpx.post(fake + "/_script", json=[{"status": 503}])
    assert run(detector(fake, "tei")).flagged
    assert len(seen(fake)["requests"]) == 2

    httpx.post(fake + "/_reset")
    httpx.post(fake + "/_script", json=[{"status": 503}, {"status": 429}])
    with pytest.raises(LLMError, match="HTTP 429"):
        run(detector(fake, "tei"))

    httpx.post(fake + "/_reset")
    with pytest.raises(LLMError, match="HTTP 404"):
        run(detector(fake, "vllm-score", model="another-model"))
    assert len(seen(fake)["requests"]) == 1  # a refusal is final


def test_a_slow_server_times_out_after_its_tries(fake):
    httpx.post(fake + "/_script", json=[{"delay": 1.5}, {"delay": 1.5}])
    with pytest.raises(LLMTimeoutError, match="timed out after 2 attempts"):
        run(detector(fake, "tei", timeout_s=0.5))


def test_a_reply_of_another_shape_is_an_error_not_a_verdict(fake):
    with pytest.raises(LLMError, match="another shape"):
        run(detector(fake, "tei", label="LABEL_7"))


def test_a_served_check_past_its_cap_checks_the_sentences_that_fit_and_leaves_the_rest_unchecked(fake):
    found = run(detector(fake, "tei", batch=1), f"{WRONG} {FAITHFUL} {WRONG}", cap=2)
    assert [(f.text, f.label) for f in found.factoids] == [(WRONG, "unsupported"), (FAITHFUL, "supported")]
    assert found.unchecked_from == len(f"{WRONG} {FAITHFUL} ") and found.settings["calls"] == 2
    assert len(seen(fake)["requests"]) == 2
    verifier = build_verifier(resolve(served(fake, "tei", batch=1), "verifier")[1])
    with pytest.raises(JudgeCallCapError):  # the verifier itself never sends past the cap
        asyncio.run(_capped(verifier.supported, [(PASSAGE, WRONG)] * 2, 1))
    assert len(seen(fake)["requests"]) == 2


async def _capped(call, texts, cap: int):
    with call_budget(cap):
        return await call(texts)


def test_one_client_keeps_its_connection_for_every_check_and_closes_with_the_verifier(fake):
    found = detector(fake, "tei", batch=1)

    async def checks() -> list:
        done = [await found.detect(RagInput(question="Q?", passages=[PASSAGE]), f"{FAITHFUL} {WRONG}")
                for _ in range(3)]
        client = found.model._loop[1]  # type: ignore[attr-defined]
        await found.aclose()
        return [done, client.is_closed]

    done, closed = asyncio.run(checks())
    assert [d.flagged for d in done] == [True] * 3 and len(seen(fake)["requests"]) == 6
    assert seen(fake)["connections"] <= 2 and closed  # the two requests of a check at once, then kept (not six)


def test_each_request_is_a_genai_span_with_the_judges_metrics(fake, monkeypatch):
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from morphguard import telemetry

    spans, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tracing = TracerProvider()
    tracing.add_span_processor(SimpleSpanProcessor(spans))
    meters = MeterProvider(metric_readers=[reader])
    monkeypatch.setattr(telemetry, "tracer", lambda: tracing.get_tracer("test"))
    monkeypatch.setattr(telemetry, "metrics", SimpleNamespace(get_meter=meters.get_meter))
    monkeypatch.setattr(telemetry, "_instruments", telemetry._instruments.__wrapped__)
    httpx.post(fake + "/_script", json=[{"status": 503}])
    run(detector(fake, "vllm-score", batch=1))
    names = [(s.name, s.attributes.get("gen_ai.operation.name"), s.attributes.get("gen_ai.provider.name"),
              s.attributes.get("error.type")) for s in spans.get_finished_spans()]
    assert names == [("score tiny-verifier", "score", "vllm", "TransientLLMError"),
                     ("score tiny-verifier", "score", "vllm", None), ("score tiny-verifier", "score", "vllm", None)]
    durations = [m for r in reader.get_metrics_data().resource_metrics for s in r.scope_metrics for m in s.metrics
                 if m.name == "gen_ai.client.operation.duration"]
    points = durations[0].data.data_points
    assert sum(p.count for p in points) == 3
    assert {p.attributes["gen_ai.request.model"] for p in points} == {"tiny-verifier"}
    assert {p.attributes["gen_ai.operation.name"] for p in points} == {"score"}


def test_a_served_verifier_that_cannot_answer_refuses_the_start_as_a_judge_would(fake):
    from morphguard.detectors.judges import require_judges
    from tests.servers import free_port as unused_port

    def config(url: str, probe: str = "required") -> Config:
        return Config.model_validate({"judge": {"model": "tiny-verifier", "runtime": "vllm-score", "api_base": url,
                                                "max_attempts": 1, "probe": probe}})

    asyncio.run(require_judges(config(fake + "/vllm"), None))
    assert seen(fake)["requests"][0]["body"]["text_2"] == ["Water boils at 100 degrees Celsius at sea level."]
    down = f"http://127.0.0.1:{unused_port()}"
    with pytest.raises(MorphguardError, match="cannot be called"):
        asyncio.run(require_judges(config(down), None))
    asyncio.run(require_judges(config(down, "warn"), None))  # warns, starts


def test_doctor_lists_the_served_verifier_and_whether_it_answers(fake, tmp_path):
    import yaml

    from tests.commands import morphguard

    def doctor(url: str):
        config = {"judge": {"model": "tiny-verifier", "runtime": "vllm-score", "api_base": url, "max_attempts": 1}}
        (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
        return morphguard("doctor", "--config", "config.yaml", cwd=tmp_path)

    done = doctor(fake + "/vllm")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok   verifier tiny-verifier (runtime vllm-score; shape claims; probe ")
    assert len(seen(fake)["requests"]) == 1
    down = doctor(f"http://127.0.0.1:{free_port()}")
    assert down.returncode == 2 and down.stdout.startswith("FAIL verifier tiny-verifier")
