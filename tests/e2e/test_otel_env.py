"""Operators' conventions work without our config reference: the standard OTEL_* variables choose and
address the exporter as the SDK's autoconfiguration defines them (config values win only where set),
and `GET /metrics` speaks Prometheus. Against a real OTLP/HTTP receiver and Prometheus's own parser."""

from __future__ import annotations

import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import serve, stop
from tests.otlp_receiver import OtlpReceiver

# a proxy of its own started under each environment
pytestmark = pytest.mark.slow

PASSAGE = "Ibuprofen is contraindicated in the third trimester of pregnancy."


def base_config(provider: str, tmp_path, telemetry: dict | None = None) -> dict:
    return {"judge": {"model": "openai/judge", "api_base": provider, "api_key": "sk-judge", "max_attempts": 1},
            "detector": {"name": "direct"},
            "proxy": {"upstream": {"base_url": provider}},
            "policy": {"audit": {"path": str(tmp_path / "audit.db")}},
            "telemetry": telemetry or {}}


def ask(base: str) -> dict:
    body = {"model": "hallucinated", "messages": [{"role": "user", "content": "Can I take ibuprofen?"}],
            "morphguard": {"context": PASSAGE}}
    response = httpx.post(base + "/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 200
    return response.json()["morphguard"]


def wait_for_spans(receiver: OtlpReceiver, name: str, timeout: float = 15) -> list:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not receiver.named(name):
        time.sleep(0.2)
    return receiver.named(name)


def test_otel_environment_alone_sends_traces_with_its_resource(provider, tmp_path):
    with OtlpReceiver() as receiver:
        env = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
               "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_SERVICE_NAME": "rag-guard-from-env",
               "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=staging,team=search",
               "OTEL_METRIC_EXPORT_INTERVAL": "500"}
        base, process = serve(base_config(provider, tmp_path), tmp_path, env=env)  # no telemetry in the config
        try:
            verdict = ask(base)
            spans = wait_for_spans(receiver, "apply_guardrail morphguard")
            time.sleep(1.5)  # a metric export
        finally:
            stop(process)
    assert verdict["checked"] and spans
    resource = spans[0].resource
    assert resource["service.name"] == "rag-guard-from-env"
    assert resource["deployment.environment"] == "staging" and resource["team"] == "search"
    assert spans[0].trace_id == verdict["trace_id"]
    assert any(name == "morphguard.decisions" for _, name in receiver.metrics)


def test_a_config_value_wins_over_the_environment_where_it_is_set(provider, tmp_path):
    with OtlpReceiver() as receiver, OtlpReceiver() as ignored:
        env = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
               "OTEL_EXPORTER_OTLP_ENDPOINT": ignored.endpoint, "OTEL_SERVICE_NAME": "from-env",
               "OTEL_RESOURCE_ATTRIBUTES": "team=search"}
        telemetry = {"exporter": "otlp-http", "endpoint": receiver.endpoint, "service_name": "from-config",
                     "project": "clinic-rag"}
        base, process = serve(base_config(provider, tmp_path, telemetry), tmp_path, env=env)
        try:
            ask(base)
            spans = wait_for_spans(receiver, "apply_guardrail morphguard")
        finally:
            stop(process)
        assert spans and not ignored.spans
    resource = spans[0].resource
    assert resource["service.name"] == "from-config" and resource["team"] == "search"  # unset here: env's
    assert resource["openinference.project.name"] == "clinic-rag"  # the Phoenix project


def test_the_environments_sampler_applies(provider, tmp_path):
    with OtlpReceiver() as receiver:
        env = {"OTEL_TRACES_EXPORTER": "otlp_proto_http", "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
               "OTEL_TRACES_SAMPLER": "always_off", "OTEL_METRICS_EXPORTER": "none"}
        base, process = serve(base_config(provider, tmp_path), tmp_path, env=env)
        try:
            assert ask(base)["checked"]
            time.sleep(1.5)
        finally:
            stop(process)
        assert receiver.spans == [] and receiver.metrics == []


def test_metrics_in_the_prometheus_format(provider, tmp_path):
    base, process = serve(base_config(provider, tmp_path, {"prometheus": True}), tmp_path)
    try:
        for _ in range(3):
            ask(base)
        response = httpx.get(base + "/metrics", timeout=10)
    finally:
        stop(process)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(response.text)}
    decisions = families["morphguard_decisions"]
    assert decisions.type == "counter"
    assert sum(s.value for s in decisions.samples if s.name.endswith("_total")) == 3
    assert {s.labels["morphguard_topic"] for s in decisions.samples} == {"healthcare"}
    assert families["morphguard_score"].type == "histogram"
    assert "morphguard_queue_depth" in families


def test_metrics_are_not_served_unless_enabled(provider, tmp_path):
    base, process = serve(base_config(provider, tmp_path), tmp_path)
    try:
        response = httpx.get(base + "/metrics", timeout=10)
    finally:
        stop(process)
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"


def test_the_grafana_dashboard_queries_instruments_that_exist(provider, tmp_path):
    """Every series the dashboard plots is one the proxy exposes (those that need an event first, such as a
    fail-open or a Redis queue, are instruments named in telemetry/names.py)."""
    import json
    import re
    from pathlib import Path

    from morphguard.telemetry import names

    dashboard = json.loads((Path(__file__).resolve().parents[2] / "docs" / "grafana" / "morphguard.json").read_text())
    queried = {re.sub(r"_(bucket|total|count|sum)$", "", m) for p in dashboard["panels"] for t in p["targets"]
               for m in re.findall(r"\b((?:morphguard|gen_ai)_[a-z_]+)\b", t["expr"])}
    queried -= {"morphguard_topic", "morphguard_action", "morphguard_flagged", "morphguard_llm_role",
                "morphguard_reason", "morphguard_checked"}  # labels, not series
    base, process = serve(base_config(provider, tmp_path, {"prometheus": True}), tmp_path)
    try:
        ask(base)
        exposed = {f.name for f in text_string_to_metric_families(httpx.get(base + "/metrics", timeout=10).text)}
    finally:
        stop(process)
    instruments = {getattr(names, n).replace(".", "_") for n in dir(names) if n.startswith("METRIC_")}
    missing = {q for q in queried if q not in exposed and q.removesuffix("_seconds") not in instruments}
    assert queried and not missing
