"""HTTP server metrics, decisions taken without a check, series present from the start, and failed upstream
calls, as a real proxy under uvicorn emits them (read in process by the in-memory reader of test_telemetry)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from morphguard.telemetry import names
from tests.telemetry.test_telemetry import (
    METRICS,
    InProcessProxy,
    llm,  # noqa: F401  (the scripted upstream and judge)
    make_config,
    post,
)


def _points() -> dict[str, list]:
    """Every data point by metric name (none before anything was recorded)."""
    points: dict[str, list] = {}
    data = METRICS.get_metrics_data()
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                points.setdefault(metric.name, []).extend(metric.data.data_points)
    return points


def send(url: str, body: dict, path: str = "/v1/chat/completions") -> int:
    request = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"authorization": "Bearer sk-client", "content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def durations(route: str) -> dict[int, int]:
    """Requests per status code recorded on http.server.request.duration for one route."""
    out: dict[int, int] = {}
    for p in _points().get(names.METRIC_HTTP_DURATION, []):
        if p.attributes.get(names.HTTP_ROUTE) == route:
            status = p.attributes[names.HTTP_STATUS]
            out[status] = out.get(status, 0) + p.count
    return out


def test_requests_are_measured_by_method_route_and_status(llm, tmp_path):  # noqa: F811
    config = make_config(llm, tmp_path)
    before = durations("/chat/completions")
    with InProcessProxy(config) as proxy:
        post(proxy.url)
        assert send(proxy.url, {"model": "m"}) == 400  # no messages
    after = durations("/chat/completions")
    assert after.get(200, 0) - before.get(200, 0) == 1
    assert after.get(400, 0) - before.get(400, 0) == 1
    points = _points()
    chat = [p for p in points[names.METRIC_HTTP_DURATION] if p.attributes.get(names.HTTP_ROUTE) == "/chat/completions"]
    assert {p.attributes[names.HTTP_METHOD] for p in chat} == {"POST"}
    assert all(p.sum > 0 for p in chat)
    active = [p for p in points[names.METRIC_HTTP_ACTIVE] if p.attributes[names.HTTP_METHOD] == "POST"]
    assert active and sum(p.value for p in active) == 0  # every request that started has ended


def test_an_unknown_method_and_path_stay_bounded_labels(llm, tmp_path):  # noqa: F811
    with InProcessProxy(make_config(llm, tmp_path)) as proxy:
        # PROPFIND (WebDAV): HTTP, but not one of the methods the conventions name
        request = urllib.request.Request(proxy.url + "/v1/made-up-path-12345", method="PROPFIND")
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(request, timeout=30)
    points = _points()[names.METRIC_HTTP_DURATION]
    assert not any("made-up" in str(v) for p in points for v in p.attributes.values())
    assert any(p.attributes[names.HTTP_METHOD] == "_OTHER" for p in points)


def decisions() -> dict[tuple[bool, str | None, str], int]:
    out: dict[tuple[bool, str | None, str], int] = {}
    for p in _points().get(names.METRIC_DECISIONS, []):
        key = (p.attributes[names.CHECKED], p.attributes.get(names.REASON), p.attributes[names.ACTION])
        out[key] = out.get(key, 0) + p.value
    return out


def test_a_request_without_context_is_not_checked_rather_than_passed(llm, tmp_path):  # noqa: F811
    config = make_config(llm, tmp_path)
    before = decisions()
    with InProcessProxy(config) as proxy:
        assert send(proxy.url, {"model": "rag-model", "messages": [{"role": "user", "content": "Hello?"}]}) == 200
        post(proxy.url)  # with context: checked
    after = decisions()
    grown = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    assert grown.get((False, "no_context", "pass")) == 1
    assert sum(v for (checked, reason, _), v in grown.items() if checked and reason is None) == 1


def test_counters_a_dashboard_reads_are_there_before_anything_happened(llm, tmp_path):  # noqa: F811
    config = make_config(llm, tmp_path, proxy={"mode": "async"})
    with InProcessProxy(config):
        points = _points()
    fail_open = {(p.attributes[names.PROFILE], p.attributes[names.TOPIC]) for p in points[names.METRIC_FAIL_OPEN]}
    assert ("general", "general") in fail_open and ("general", "healthcare") in fail_open
    errors = {p.attributes[names.REASON] for p in points[names.METRIC_ERRORS]}
    assert {"audit_failed", "judge_error", "judge_timeout", "upstream_unavailable"} <= errors
    for gauge in (names.METRIC_QUEUE_LAG, names.METRIC_QUEUE_DEPTH, names.METRIC_ESCALATION_BACKLOG):
        assert [p.value for p in points[gauge]] == [0], gauge


def upstream_calls() -> list:
    return [p for p in _points().get(names.METRIC_DURATION, []) if p.attributes[names.ROLE] == "upstream"]


def test_upstream_calls_carry_the_server_the_response_model_and_a_failures_type(llm, tmp_path):  # noqa: F811
    config = make_config(llm, tmp_path, metric_models=["rag-*"])
    with InProcessProxy(config) as proxy:
        post(proxy.url)
    answered = [p for p in upstream_calls() if names.ERROR_TYPE not in p.attributes]
    host, port = llm.base_url.split("//")[1].split("/")[0].split(":")
    assert any(p.attributes.get(names.SERVER_ADDRESS) == host and p.attributes.get(names.SERVER_PORT) == int(port)
               and names.RESPONSE_MODEL in p.attributes for p in answered)

    down = make_config(llm, tmp_path)
    down = down.model_copy(update={"proxy": down.proxy.model_copy(update={
        "upstream": down.proxy.upstream.model_copy(update={"base_url": "http://127.0.0.1:9/v1", "max_attempts": 1})})})
    with InProcessProxy(down) as proxy:
        assert send(proxy.url, {"model": "rag-model", "messages": [{"role": "user", "content": "Hi"}]}) == 502
    failed = [p for p in upstream_calls() if names.ERROR_TYPE in p.attributes]
    assert any(p.attributes.get(names.SERVER_PORT) == 9 and p.count >= 1 for p in failed)
    assert all(p.attributes[names.ERROR_TYPE].isidentifier() or p.attributes[names.ERROR_TYPE].isdigit()
               for p in failed)


def failed_calls(provider: str) -> int:
    """Failed upstream calls to the unreachable port 9, recorded for one provider."""
    return sum(p.count for p in upstream_calls() if names.ERROR_TYPE in p.attributes
               and p.attributes.get(names.SERVER_PORT) == 9 and p.attributes[names.PROVIDER_NAME] == provider)


@pytest.mark.parametrize("path, body, provider", [
    ("/v1/responses", {"model": "rag-model", "input": "Hi"}, "openai"),
    ("/v1/responses", {"model": "rag-model", "input": "Hi", "stream": True}, "openai"),
    ("/v1/messages", {"model": "rag-model", "max_tokens": 50, "messages": [{"role": "user", "content": "Hi"}]},
     "anthropic"),
    ("/v1/messages", {"model": "rag-model", "max_tokens": 50, "stream": True,
                      "messages": [{"role": "user", "content": "Hi"}]}, "anthropic"),
])
def test_each_apis_failed_upstream_call_is_timed_with_its_type(llm, tmp_path, path, body, provider):  # noqa: F811
    down = make_config(llm, tmp_path)
    down = down.model_copy(update={"proxy": down.proxy.model_copy(update={
        "upstream": down.proxy.upstream.model_copy(update={"base_url": "http://127.0.0.1:9/v1", "max_attempts": 1})})})
    before = failed_calls(provider)
    with InProcessProxy(down) as proxy:
        assert send(proxy.url, body, path) == 502
    assert failed_calls(provider) == before + 1


def test_a_judge_call_that_fails_is_timed_with_its_error_type(llm, tmp_path):  # noqa: F811
    config = make_config(llm, tmp_path)
    config = config.model_copy(update={"judge": config.judge.model_copy(
        update={"api_base": "http://127.0.0.1:9/v1", "max_attempts": 1, "timeout_s": 2, "probe": "warn"})})
    with InProcessProxy(config) as proxy:
        post(proxy.url)  # the check fails and the general profile fails open: still a 200
    failed = [p for p in _points()[names.METRIC_DURATION]
              if p.attributes[names.ROLE] == "judge" and names.ERROR_TYPE in p.attributes]
    assert failed and all(p.attributes[names.ERROR_TYPE].isidentifier() for p in failed)
