"""A `morphguard worker` with `--port` answers the probes a replica answers, on real Redis and PostgreSQL:
/healthz, /readyz (503 naming what is down) and /metrics in the Prometheus text format, behind its token."""

from __future__ import annotations

import socket
import time

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import ROOT
from tests.e2e.test_fleet import fleet_config, start_worker
from tests.forked import run_command
from tests.servers import FLEET_KEY, free_port, fresh_database, stop

TOKEN = "scrape-me-9f2c"
SCRAPE = {"authorization": f"Bearer {TOKEN}"}


def until(predicate, timeout: float = 60):
    """The first true value of `predicate()` within `timeout` s, else its last value."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return value


def scraped(base: str) -> httpx.Response | None:
    """/metrics once the queue's gauges are in it: the worker exports them after its first look at the queue."""
    response = httpx.get(base + "/metrics", headers=SCRAPE, timeout=10)
    return response if "morphguard_queue_depth" in response.text else None


def test_a_worker_serves_health_readiness_and_metrics(provider, redis_url, postgres, tmp_path):
    config = fleet_config(provider, redis_url, fresh_database(postgres.url, "probes"))
    config["telemetry"] = {"prometheus": True, "metrics_token": TOKEN}
    port = free_port()
    worker = start_worker(config, tmp_path, port=port)
    base = f"http://127.0.0.1:{port}"
    try:
        health = httpx.get(base + "/healthz", timeout=10)
        ready = httpx.get(base + "/readyz", timeout=10)
        refused = httpx.get(base + "/metrics", timeout=10)
        metrics = until(lambda: scraped(base))
        unknown = httpx.get(base + "/v1/chat/completions", timeout=10)
        postgres.stop()
        store_down = httpx.get(base + "/readyz", timeout=10)
        postgres.start()
        back = until(lambda: httpx.get(base + "/readyz", timeout=10).status_code == 200)
    finally:
        stop(worker)

    assert health.status_code == 200 and health.json() == {"status": "ok"}
    assert ready.status_code == 200
    assert ready.json()["checks"] == {"queue": True, "store": True}
    assert ready.json()["escalation_backlog"] == {"pending": 0, "undelivered": 0, "retrying": 0}

    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert metrics is not None and metrics.headers["content-type"].startswith("text/plain; version=")
    families = {f.name: f for f in text_string_to_metric_families(metrics.text)}
    assert families["morphguard_queue_depth"].type == "gauge"
    assert families["morphguard_escalations_backlog"].samples[0].value == 0
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "not_found"

    assert store_down.status_code == 503
    assert store_down.json() == {"status": "not_ready", "checks": {"queue": True, "store": False}}
    assert back


def test_a_port_in_use_ends_the_worker_with_one_line_before_it_connects_anything(tmp_path):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"queue": {"url": "redis://127.0.0.1:9/0",
                                                                       "fleet_key": FLEET_KEY}}))
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        ended = run_command(["worker", "--config", str(tmp_path / "config.yaml"), "--port", str(port)], cwd=ROOT)
    assert ended.returncode == 2
    [line] = ended.stderr.strip().splitlines()  # no traceback, no Redis error: it never got that far
    assert line.startswith(f"morphguard: the worker's probes cannot listen on 127.0.0.1:{port}: ")
