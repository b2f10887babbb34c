"""The deployment files: what the compose fleet and the Kubernetes manifests run is one configuration, valid, and
each long-running process is probed and sized. `deploy/smoke.sh` (run by CI) builds and runs them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from morphguard.config import load_config

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
KUBE = DEPLOY / "kubernetes"
TRIAL_ENV = {"PGPASSWORD": "p", "MORPHGUARD_REVIEW_SECRET": "s" * 32, "MORPHGUARD_REVIEW_KEY": "k"}


def _docs() -> list[dict]:
    listed = yaml.safe_load((KUBE / "kustomization.yaml").read_text())["resources"]
    return [doc for name in listed for doc in yaml.safe_load_all((KUBE / name).read_text()) if doc]


def _named(kind: str) -> dict[str, dict]:
    return {doc["metadata"]["name"]: doc for doc in _docs() if doc["kind"] == kind}


def test_kustomization_lists_every_manifest():
    listed = set(yaml.safe_load((KUBE / "kustomization.yaml").read_text())["resources"])
    present = {str(p.relative_to(KUBE)) for p in KUBE.rglob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present


def test_the_config_map_holds_the_fleet_config_verbatim():
    config_map = _named("ConfigMap")["morphguard-config"]
    assert config_map["data"]["config.yaml"] == (DEPLOY / "fleet.yaml").read_text()


def test_the_scripted_upstream_config_map_holds_the_script_verbatim():
    config_map = _named("ConfigMap")["morphguard-scripted-upstream"]
    assert config_map["data"]["scripted_upstream.py"] == (DEPLOY / "scripted_upstream.py").read_text()


@pytest.mark.parametrize("hosts", [{}, {"REDIS_HOST": "morphguard-redis", "PGHOST": "morphguard-postgres"}])
def test_the_fleet_config_is_valid_and_names_the_shared_stores(monkeypatch, hosts):
    for name, value in {**TRIAL_ENV, **hosts}.items():
        monkeypatch.setenv(name, value)
    config = load_config(DEPLOY / "fleet.yaml")
    assert config.proxy.host == "0.0.0.0" and config.proxy.inline_via == "workers"
    assert config.store.url == f"postgresql://morphguard:p@{hosts.get('PGHOST', 'postgres')}:5432/morphguard"
    assert config.queue.url == f"redis://{hosts.get('REDIS_HOST', 'redis')}:6379/0"


def test_the_kubernetes_hosts_are_the_services():
    services = set(_named("Service"))
    for deployment in _named("Deployment").values():
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            for env in container.get("env", []):
                if env["name"] in ("REDIS_HOST", "PGHOST"):
                    assert env["value"] in services
                if env["name"] == "MORPHGUARD_UPSTREAM_URL":
                    assert env["value"].split("//")[1].split(":")[0] in services


@pytest.mark.parametrize("name, port", [("morphguard-proxy", "http"), ("morphguard-worker", "probes")])
def test_proxy_and_worker_are_probed_and_sized(name, port):
    pod = _named("Deployment")[name]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port}
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert {"secretRef": {"name": "morphguard-secrets"}} in container["envFrom"]


def test_the_proxy_keeps_a_replica_through_disruptions_and_scales_on_cpu():
    assert _named("Deployment")["morphguard-proxy"]["spec"]["replicas"] >= 2
    budget = _named("PodDisruptionBudget")["morphguard-proxy"]["spec"]
    assert budget["minAvailable"] >= 1
    assert budget["selector"] == _named("Deployment")["morphguard-proxy"]["spec"]["selector"]
    (metric,) = _named("HorizontalPodAutoscaler")["morphguard-proxy"]["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu"


def test_compose_runs_the_fleet_from_the_same_config():
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert {"proxy-1", "proxy-2", "worker", "review", "redis", "postgres", "upstream"} <= set(services)
    for name in ("proxy-1", "proxy-2", "worker", "review"):
        assert "./fleet.yaml:/etc/morphguard/config.yaml:ro,Z" in services[name]["volumes"]
    assert services["worker"]["command"][0] == "worker" and services["review"]["command"][0] == "review"
    for name in ("proxy-1", "proxy-2", "review"):  # published on loopback only
        assert all(port.startswith("127.0.0.1:") for port in services[name]["ports"])
