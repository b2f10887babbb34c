"""docs/prometheus: recording rules (rules.yml) and alert rules (alerts.yml) Prometheus loads and whose unit tests
pass (promtool), over metric and label names a running replica and a running worker export, as scraped from their
/metrics. A rule on a name nobody exports never fires."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import ROOT, serve, stop
from tests.e2e.test_fleet import fleet_config, folders, post, start_worker, wait_for
from tests.e2e.test_worker_probes import until
from tests.servers import free_port

FOLDER = ROOT / "docs" / "prometheus"
RULES = (FOLDER / "rules.yml", FOLDER / "alerts.yml")
# What Prometheus adds itself: the per-target `up` series and the target labels of every series.
PROMETHEUS_OWN = {"up", "job", "instance"}
PROMQL_WORDS = {"and", "or", "unless", "bool", "offset", "on", "ignoring", "group_left", "group_right"}


def expressions() -> dict[str, str]:
    """Every rule's expression, by the name it records or the alert it raises."""
    out = {}
    for path in RULES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            out |= {rule.get("alert") or rule["record"]: rule["expr"] for rule in group["rules"]}
    return out


def recorded() -> set[str]:
    return {name for name in expressions() if ":" in name}


def metric_names(expr: str) -> set[str]:
    """The metric names of a PromQL expression: what is left once label matchers, ranges and by/without
    lists are taken out, less function names (followed by a parenthesis) and keywords."""
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\b(?:by|without)\s*\([^)]*\)", " ", expr)
    return set(re.findall(r"\b[a-zA-Z_:][a-zA-Z0-9_:]*\b(?!\s*\()", bare)) - PROMQL_WORDS


def label_names(expr: str) -> set[str]:
    """The label names an expression matches on or groups by."""
    matched = re.findall(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)", " ".join(re.findall(r"\{[^}]*\}", expr)))
    grouped = re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr)
    return set(matched) | {name.strip() for names in grouped for name in names.split(",") if name.strip()}


def exported(*bases: str) -> tuple[set[str], set[str]]:
    """The sample names (counters with their _total) and label names the processes' /metrics show."""
    samples, labels = set(), set()
    for base in bases:
        for family in text_string_to_metric_families(httpx.get(base + "/metrics", timeout=10).text):
            for sample in family.samples:
                samples.add(sample.name)
                labels |= set(sample.labels)
    return samples, labels


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        message = "promtool is not installed (apt-get install -y prometheus)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


def test_promtool_accepts_the_rules():
    checked = subprocess.run([promtool(), "check", "rules", *map(str, RULES)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_rules_fire_on_the_series_they_are_written_for():
    """tests.yml: a judge that is down, a fleet failing open, audit failures, a growing queue and a jump in the
    block rate each raise their alert, and a healthy fleet raises none."""
    tested = subprocess.run([promtool(), "test", "rules", "tests.yml"], capture_output=True, text=True, cwd=FOLDER)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_the_rules_cover_what_an_operator_of_a_fleet_is_paged_for():
    named = {name for expr in expressions().values() for name in metric_names(expr)}
    assert {"up", "morphguard_fail_open_total", "morphguard_errors_total", "morphguard_queue_lag",
            "morphguard_escalations_backlog", "morphguard_decisions_total",
            "http_server_request_duration_seconds_count"} <= named
    assert {"MorphguardFailingOpen", "MorphguardJudgeDown", "MorphguardQueueLagGrowing",
            "MorphguardAuditWriteFailures", "MorphguardBlockRateJump"} <= set(expressions())
    judged = " ".join(expressions().values())
    assert '"audit_failed"' in judged and "judge_error" in judged


@pytest.mark.slow  # ten seconds or more of its own
def test_every_rule_names_metrics_and_labels_a_replica_or_worker_exports(provider, redis_url, postgres_url,
                                                                         tmp_path):
    # A judge that refuses every call, only warned of at start: each check fails, fails open and is a judge error.
    config = fleet_config(provider, redis_url, postgres_url, judge="broken-judge")
    config["judge"]["probe"] = "warn"
    config["telemetry"] = {"prometheus": True}
    replica_folder, worker_folder = folders(tmp_path, 2, "node")
    replica_base, replica = serve(config, replica_folder)
    port = free_port()
    worker = start_worker(config, worker_folder, port=port)
    wanted = {name for expr in expressions().values() for name in metric_names(expr)} - PROMETHEUS_OWN - recorded()
    bases = (replica_base, f"http://127.0.0.1:{port}")
    try:
        queued = post(replica_base, 0)
        assert queued is not None and queued in wait_for({queued}, postgres_url, timeout=60)
        # the queue's gauges appear after each process's first look at the queue (every 2 s)
        until(lambda: wanted <= exported(*bases)[0])
        samples, labels = exported(*bases)
    finally:
        stop(worker)
        stop(replica)
    for alert, expr in expressions().items():
        assert metric_names(expr) - PROMETHEUS_OWN - recorded() <= samples, alert
        assert label_names(expr) - PROMETHEUS_OWN <= labels, alert


def test_the_dashboard_reads_only_series_the_recording_rules_define():
    dashboard = json.loads((ROOT / "docs" / "grafana" / "morphguard.json").read_text())
    read = {name for panel in dashboard["panels"] for target in panel["targets"]
            for name in re.findall(r"\bmorphguard:[a-z_0-9:]+", target["expr"])}
    assert read and read <= recorded(), read - recorded()
