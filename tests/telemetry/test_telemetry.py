"""Spans, events and metrics of real requests through the proxy (uvicorn on a loopback socket, in this
process so in-memory exporters can read what it emitted), with a scripted upstream and judge."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import pytest
import uvicorn
from opentelemetry import trace
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from morphguard.config import Config
from morphguard.proxy.app import create_app
from morphguard.telemetry import names, setup
from tests.detectors.scripted_judge import judge
from tests.scripted_llm import ScriptedLLM, completion
from tests.servers import bound_socket

PASSAGE = "Ibuprofen is contraindicated in the third trimester of pregnancy."
FALSE_FACT = "Ibuprofen is safe throughout pregnancy."
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
SPANS = InMemorySpanExporter()
METRICS = InMemoryMetricReader()


def scripted(body):
    """RAG requests get the false answer; MetaRAG's prompts a judge that refutes it."""
    if body["messages"][0]["role"] == "system" and "<" in body["messages"][-1]["content"]:
        verdict = lambda s: '{"verdict": "YES"}' if s.startswith("A") else '{"verdict": "NO"}'  # noqa: E731
        return judge([FALSE_FACT], verdict)(body)
    return completion(FALSE_FACT, prompt_tokens=31, completion_tokens=9)


class InProcessProxy:
    def __init__(self, config: Config) -> None:
        self.socket = bound_socket()  # the port is ours from here on, whatever else starts meanwhile
        self.port = self.socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(create_app(config), host="127.0.0.1", port=self.port,
                                                    log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True)

    def __enter__(self) -> InProcessProxy:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "proxy did not start"
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


@pytest.fixture(scope="module")
def llm():
    with ScriptedLLM(scripted) as server:
        yield server


def make_config(llm, tmp_path, **telemetry) -> Config:
    config = Config.model_validate({
        "judge": {"model": "openai/judge", "api_base": llm.base_url, "api_key": "sk-judge-secret"},
        "detector": {"name": "metarag"},
        "metarag": {"profile": "paper"},
        "proxy": {"upstream": {"base_url": llm.base_url}, **telemetry.pop("proxy", {})},
        "policy": {"audit": {"path": str(tmp_path / "audit.db")}},
        "telemetry": {"exporter": "none", **telemetry},
    })
    setup.configure(config.telemetry, span_exporter=SPANS, metric_reader=METRICS)
    return config


class Reply:
    def __init__(self, response) -> None:
        self.headers = response.headers
        self.body = json.loads(response.read())

    def json(self):
        return self.body


def post(url: str, **headers: str) -> Reply:
    """A plain urllib client: this process's httpx is instrumented and would start (and inject) its own trace."""
    body = {"model": "rag-model", "messages": [{"role": "user", "content": "Can pregnant women take ibuprofen?"}],
            "morphguard": {"context": [PASSAGE]}}
    request = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(), method="POST",
                                     headers={"authorization": "Bearer sk-client-secret",
                                              "content-type": "application/json", **headers})
    with urllib.request.urlopen(request, timeout=60) as response:
        return Reply(response)


def finished() -> list:
    trace.get_tracer_provider().force_flush()
    return list(SPANS.get_finished_spans())


def by_name(spans, name):
    return [s for s in spans if s.name == name]


def test_an_inline_check_is_a_span_tree_under_the_callers_trace(llm, tmp_path):
    SPANS.clear()
    with InProcessProxy(make_config(llm, tmp_path)) as proxy:
        response = post(proxy.url, traceparent=TRACEPARENT)
    verdict = response.json()["morphguard"]
    spans = finished()
    trace_id = int(TRACEPARENT.split("-")[1], 16)
    assert verdict["trace_id"] == TRACEPARENT.split("-")[1]
    assert response.headers["x-morphguard-trace-id"] == TRACEPARENT.split("-")[1]

    (server,) = [s for s in spans if s.kind is SpanKind.SERVER and s.context.trace_id == trace_id]
    assert server.name == "POST /chat/completions" and server.attributes[names.HTTP_STATUS] == 200
    assert server.parent.span_id == int(TRACEPARENT.split("-")[2], 16)  # continues the caller's trace

    (chat,) = by_name(spans, "chat rag-model")
    assert chat.parent.span_id == server.context.span_id and chat.kind is SpanKind.CLIENT
    assert chat.attributes[names.OPERATION_NAME] == "chat" and chat.attributes[names.PROVIDER_NAME] == "openai"
    assert chat.attributes[names.REQUEST_MODEL] == "rag-model"
    assert chat.attributes[names.RESPONSE_MODEL] == "scripted"
    assert (chat.attributes[names.INPUT_TOKENS], chat.attributes[names.OUTPUT_TOKENS]) == (31, 9)
    assert chat.attributes[names.FINISH_REASONS] == ("stop",)

    (guard,) = by_name(spans, "apply_guardrail morphguard")
    assert guard.parent.span_id == chat.context.span_id
    assert guard.attributes[names.GUARDRAIL_DECISION] == "warn" and guard.attributes[names.ACTION] == "annotate"
    assert guard.attributes[names.TOPIC] == "pregnancy" and guard.attributes[names.THRESHOLD] == 0.175
    assert guard.attributes[names.SCORE] == 1.0 and guard.attributes[names.REQUEST_ID] == verdict["request_id"]
    # the check's span lies within the request, though the chat span ends when the upstream answered
    assert chat.end_time < guard.end_time

    (evaluation,) = [e for e in chat.events if e.name == "gen_ai.evaluation.result"]
    assert evaluation.attributes[names.EVALUATION_NAME] == "hallucination"
    assert evaluation.attributes[names.EVALUATION_SCORE] == 1.0
    assert evaluation.attributes[names.EVALUATION_LABEL] == "hallucinated"
    assert "1 of 1 factoids" in evaluation.attributes[names.EVALUATION_EXPLANATION]
    (factoid,) = [e for e in guard.events if e.name == "morphguard.factoid"]
    assert factoid.attributes[names.FACTOID_SCORE] == 1.0 and factoid.attributes[names.FACTOID_START] == 0

    stages = {s.name: s for s in spans if s.context.trace_id == trace_id and s.parent
              and s.parent.span_id == guard.context.span_id}
    assert set(stages) == {"decompose", "mutate", "verify"}
    judge_calls = [s for s in by_name(spans, "chat openai/judge") if s.context.trace_id == trace_id]
    assert len(judge_calls) == 7  # decompose 1, mutate 2, verify 4
    assert {s.parent.span_id for s in judge_calls} == {st.context.span_id for st in stages.values()}
    verify_calls = [s for s in judge_calls if s.parent.span_id == stages["verify"].context.span_id]
    assert len(verify_calls) == 4 and stages["verify"].attributes[names.STAGE_CALLS] == 4


def test_no_content_and_no_secret_is_recorded_by_default(llm, tmp_path):
    SPANS.clear()
    with InProcessProxy(make_config(llm, tmp_path)) as proxy:
        post(proxy.url)
    recorded = json.dumps([{**dict(s.attributes), "events": [dict(e.attributes) for e in s.events]}
                           for s in finished()])
    for secret in ("sk-client-secret", "sk-judge-secret", "Bearer"):
        assert secret not in recorded
    for content in (PASSAGE, FALSE_FACT, "Can pregnant women"):
        assert content not in recorded
    assert names.INPUT_MESSAGES not in recorded and names.QUESTION not in recorded


def test_content_capture_and_openinference_are_opt_in(llm, tmp_path):
    SPANS.clear()
    with InProcessProxy(make_config(llm, tmp_path, capture_content=True, openinference=True)) as proxy:
        post(proxy.url)
    spans = finished()
    (chat,) = by_name(spans, "chat rag-model")
    assert json.loads(chat.attributes[names.INPUT_MESSAGES])[0]["content"] == "Can pregnant women take ibuprofen?"
    assert chat.attributes[names.OI_SPAN_KIND] == "LLM" and chat.attributes[names.OI_OUTPUT] == FALSE_FACT
    (guard,) = by_name(spans, "apply_guardrail morphguard")
    assert guard.attributes[names.OI_SPAN_KIND] == "GUARDRAIL"
    assert guard.attributes[names.OI_EVAL_LABEL] == "hallucinated" and guard.attributes[names.OI_EVAL_SCORE] == 1.0
    assert guard.attributes[names.CONTEXT] == PASSAGE and guard.attributes[names.ANSWER] == FALSE_FACT
    recorded = json.dumps([dict(s.attributes) for s in spans])
    assert "sk-client-secret" not in recorded and "sk-judge-secret" not in recorded


def test_an_async_check_is_its_own_trace_linked_to_the_request(llm, tmp_path):
    SPANS.clear()
    with InProcessProxy(make_config(llm, tmp_path, proxy={"mode": "async"})) as proxy:
        verdict = post(proxy.url).json()["morphguard"]
        deadline = time.monotonic() + 30
        while not by_name(finished(), "apply_guardrail morphguard") and time.monotonic() < deadline:
            time.sleep(0.1)
    spans = finished()
    (chat,) = by_name(spans, "chat rag-model")
    (guard,) = by_name(spans, "apply_guardrail morphguard")
    assert guard.parent is None and guard.context.trace_id != chat.context.trace_id
    assert [link.context.span_id for link in guard.links] == [chat.context.span_id]
    assert guard.attributes[names.REQUEST_ID] == chat.attributes[names.REQUEST_ID] == verdict["request_id"]
    assert guard.attributes[names.CHECK_MODE] == "async"
    assert any(e.name == "gen_ai.evaluation.result" for e in guard.events)  # the chat span had ended


def test_metrics_for_calls_scores_and_decisions(llm, tmp_path):
    with InProcessProxy(make_config(llm, tmp_path)) as proxy:
        post(proxy.url)
    data = METRICS.get_metrics_data()
    points: dict[str, list] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                points.setdefault(metric.name, []).extend(metric.data.data_points)
    tokens = points["gen_ai.client.token.usage"]
    roles = {(p.attributes[names.ROLE], p.attributes[names.TOKEN_TYPE]) for p in tokens}
    assert {("upstream", "input"), ("upstream", "output"), ("judge", "input"), ("judge", "output")} <= roles
    assert any(p.attributes[names.ROLE] == "judge" and p.count >= 7 for p in points["gen_ai.client.operation.duration"])
    assert any(p.max == 1.0 for p in points["morphguard.score"])
    decisions = {(p.attributes[names.ACTION], p.attributes[names.TOPIC]): p.value
                 for p in points["morphguard.decisions"]}
    assert decisions[("annotate", "pregnancy")] >= 1


def test_fail_open_and_queue_depth_metrics(llm, tmp_path):
    config = make_config(llm, tmp_path, proxy={"mode": "async"})
    # a judge that cannot be reached: every check fails, and the general profile fails open
    config = config.model_copy(update={"judge": config.judge.model_copy(
        update={"api_base": "http://127.0.0.1:9/v1", "max_attempts": 1, "timeout_s": 2, "probe": "warn"})})
    with InProcessProxy(config) as proxy:
        post(proxy.url)
        post(proxy.url)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            points = _points()
            if sum(p.value for p in points.get("morphguard.fail_open", [])) >= 2:
                break
            time.sleep(0.2)
    assert sum(p.value for p in points["morphguard.fail_open"]) >= 2
    assert sum(p.value for p in points["morphguard.queue.depth"]) == 0  # both queued, both taken
    errors = {p.attributes[names.REASON]: p.value for p in points["morphguard.errors"]}
    assert errors["judge_error"] >= 2  # counted as errors too: a fail_closed profile would count no fail_open


def _points() -> dict[str, list]:
    points: dict[str, list] = {}
    for resource in METRICS.get_metrics_data().resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                points.setdefault(metric.name, []).extend(metric.data.data_points)
    return points


def test_requests_that_end_in_an_upstream_error_are_counted_by_reason(llm, tmp_path):
    config = make_config(llm, tmp_path)
    config = config.model_copy(update={"proxy": config.proxy.model_copy(update={
        "upstream": config.proxy.upstream.model_copy(update={"base_url": "http://127.0.0.1:9/v1",
                                                             "max_attempts": 1})})})
    with InProcessProxy(config) as proxy:
        with pytest.raises(urllib.error.HTTPError) as err:
            post(proxy.url)
    assert err.value.code == 502
    errors = {p.attributes[names.REASON]: p.value for p in _points().get("morphguard.errors", [])}
    assert errors.get("upstream_unavailable", 0) >= 1


def get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_probes_leave_no_trace_unless_configured_and_requests_still_do(llm, tmp_path, monkeypatch):
    monkeypatch.delenv("OTEL_PYTHON_EXCLUDED_URLS", raising=False)
    SPANS.clear()
    with InProcessProxy(make_config(llm, tmp_path)) as proxy:
        assert get(proxy.url + "/healthz") == 200 and get(proxy.url + "/readyz") in (200, 503)
        post(proxy.url)
    spans = finished()
    assert [s.name for s in spans if s.kind is SpanKind.SERVER] == ["POST /chat/completions"]
    assert not [s for s in spans if s.name.startswith("GET")]  # the readiness probe's own upstream call neither

    SPANS.clear()
    monkeypatch.setenv("OTEL_PYTHON_EXCLUDED_URLS", "/chat/completions")  # the OpenTelemetry convention
    with InProcessProxy(make_config(llm, tmp_path)) as proxy:
        get(proxy.url + "/healthz")
        post(proxy.url)
    assert sorted(s.name for s in finished() if s.kind is SpanKind.SERVER) == ["GET /healthz"]

    SPANS.clear()
    with InProcessProxy(make_config(llm, tmp_path, excluded_urls=[])) as proxy:  # the config wins
        get(proxy.url + "/healthz")
    assert [s.name for s in finished() if s.kind is SpanKind.SERVER] == ["GET /healthz"]


def test_every_route_names_its_server_span(llm, tmp_path):
    SPANS.clear()
    with InProcessProxy(make_config(llm, tmp_path)) as proxy:
        for method, path, body in (("POST", "/v1/responses", {"model": "m", "input": "Hi"}),
                                   ("POST", "/v1/messages", {"model": "m", "max_tokens": 5,
                                                             "messages": [{"role": "user", "content": "Hi"}]}),
                                   ("GET", "/v1/models", None)):
            request = urllib.request.Request(proxy.url + path, method=method,
                                             data=json.dumps(body).encode() if body else None,
                                             headers={"content-type": "application/json", "traceparent": TRACEPARENT})
            try:
                urllib.request.urlopen(request, timeout=60).read()
            except urllib.error.HTTPError:  # the scripted provider serves chat only: its error is passed on
                pass
    routes = {s.name: s.attributes.get(names.HTTP_ROUTE) for s in finished() if s.kind is SpanKind.SERVER}
    assert routes == {"POST /responses": "/responses", "POST /messages": "/messages", "GET /v1/{path}": "/v1/{path}"}

