"""The deployment files: what the compose fleet and the Kubernetes manifests run is one configuration, valid, and
each long-running process is probed, sized and hardened; Redis and PostgreSQL take credentials and only
morphguard's pods reach them; no secret ships in a file a default deploy applies. `deploy/smoke.sh` (run by CI)
builds and runs them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from morphguard.config import load_config
from morphguard.errors import ConfigError

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
KUBE = DEPLOY / "kubernetes"
SECRETS = ("PGPASSWORD", "POSTGRES_PASSWORD", "REDIS_PASSWORD", "MORPHGUARD_FLEET_KEY", "MORPHGUARD_REVIEW_SECRET",
           "MORPHGUARD_REVIEW_KEY", "MORPHGUARD_PROXY_KEY", "MORPHGUARD_UPSTREAM_API_KEY", "MORPHGUARD_JUDGE_API_KEY")
TRIAL_ENV = {"PGPASSWORD": "p", "REDIS_PASSWORD": "r" * 64, "MORPHGUARD_FLEET_KEY": "f" * 64,
             "MORPHGUARD_REVIEW_SECRET": "s" * 32, "MORPHGUARD_REVIEW_KEY": "k" * 32, "MORPHGUARD_PROXY_KEY": "x" * 64,
             "MORPHGUARD_UPSTREAM_API_KEY": "u" * 64}


def _docs() -> list[dict]:
    listed = yaml.safe_load((KUBE / "kustomization.yaml").read_text())["resources"]
    return [doc for name in listed for doc in yaml.safe_load_all((KUBE / name).read_text()) if doc]


def _named(kind: str) -> dict[str, dict]:
    return {doc["metadata"]["name"]: doc for doc in _docs() if doc["kind"] == kind}


def _deployments() -> list[tuple[str, dict]]:
    return [(name, doc["spec"]["template"]["spec"]) for name, doc in _named("Deployment").items()]


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
    assert config.queue.url == f"redis://:{'r' * 64}@{hosts.get('REDIS_HOST', 'redis')}:6379/0"
    assert config.queue.fleet_key is not None and config.queue.fleet_key.get_secret_value() == "f" * 64
    assert [k.get_secret_value() for k in config.proxy.keys] == ["x" * 64]  # clients present the fleet's key
    assert config.proxy.upstream.api_key is not None  # ... and the provider's stays in the fleet


def test_the_fleet_config_does_not_start_without_its_generated_secrets(monkeypatch):
    for name in SECRETS:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError, match="environment variable"):
        load_config(DEPLOY / "fleet.yaml")


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


def test_no_secret_ships_in_what_a_default_deploy_applies():
    assert not (DEPLOY / "trial.env").exists() and not _named("Secret")
    kustomization = yaml.safe_load((KUBE / "kustomization.yaml").read_text())
    (generated,) = kustomization["secretGenerator"]
    assert generated["name"] == "morphguard-secrets" and generated["envs"] == ["secrets.env"]
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    for name, service in compose["services"].items():
        assert service.get("env_file") in (None, "secrets.env"), name
    ignored = (DEPLOY.parent / ".gitignore").read_text().splitlines()
    assert {"deploy/secrets.env", "deploy/kubernetes/secrets.env"} <= set(ignored)


def test_secrets_sh_generates_every_secret_the_fleet_reads_and_keeps_what_is_there(tmp_path):
    import shutil
    import subprocess

    shutil.copy(DEPLOY / "secrets.sh", tmp_path / "secrets.sh")
    (tmp_path / "kubernetes").mkdir()
    subprocess.run(["sh", str(tmp_path / "secrets.sh")], check=True, capture_output=True, env={"PATH": "/usr/bin:/bin"})
    first = (tmp_path / "secrets.env").read_text()
    values = dict(line.split("=", 1) for line in first.splitlines())
    assert set(values) == set(SECRETS)
    for name in set(SECRETS) - {"MORPHGUARD_JUDGE_API_KEY"}:
        assert len(values[name]) == 64 and int(values[name], 16) >= 0, name
    assert values["PGPASSWORD"] == values["POSTGRES_PASSWORD"]
    assert values["MORPHGUARD_FLEET_KEY"] != values["MORPHGUARD_REVIEW_SECRET"]
    assert (tmp_path / "secrets.env").stat().st_mode & 0o077 == 0
    kube = (tmp_path / "kubernetes" / "secrets.env").read_text()
    assert set(dict(line.split("=", 1) for line in kube.splitlines())) == set(SECRETS) and kube != first
    subprocess.run(["sh", str(tmp_path / "secrets.sh")], check=True, capture_output=True, env={"PATH": "/usr/bin:/bin"})
    assert (tmp_path / "secrets.env").read_text() == first


def test_redis_takes_a_password_in_compose_and_kubernetes():
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]["redis"]
    assert "--requirepass \"$$REDIS_PASSWORD\"" in compose["entrypoint"][-1]
    assert "protected-mode no" not in " ".join(compose["entrypoint"])
    pod = _named("Deployment")["morphguard-redis"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert "--requirepass \"$REDIS_PASSWORD\"" in container["command"][-1]
    secret = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"]}
    assert secret["REDIS_PASSWORD"] == {"name": "morphguard-secrets", "key": "REDIS_PASSWORD"}


@pytest.mark.parametrize("name, pod", _deployments())
def test_every_deployment_is_hardened_probed_and_limited(name, pod):
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    for container in pod["containers"]:
        context = container["securityContext"]
        assert context["readOnlyRootFilesystem"] is True
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"] == {"drop": ["ALL"]}
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert "emptyDir" in volumes[mounts["/tmp"]]  # what must be written goes to a volume of its own
        assert container["readinessProbe"] and container["livenessProbe"]
        assert {"cpu", "memory"} <= set(container["resources"]["limits"])
        assert {"cpu", "memory"} <= set(container["resources"]["requests"])


def test_only_morphguards_pods_reach_redis_postgres_and_the_worker_probes():
    policies = _named("NetworkPolicy")

    def admitted(target: str, port: int) -> set[str]:
        """The pods (by name label) the policy on `target` admits on `port`; '*' for any pod of morphguard."""
        (policy,) = [p["spec"] for p in policies.values() if p["spec"]["podSelector"]["matchLabels"] ==
                     {"app.kubernetes.io/name": target}]
        assert policy["policyTypes"] == ["Ingress"]
        names: set[str] = set()
        for rule in policy["ingress"]:
            assert [p["port"] for p in rule["ports"]] == [port]
            for peer in rule["from"]:
                assert set(peer) == {"podSelector"}  # no namespaceSelector or ipBlock: pods of this namespace
                selector = peer["podSelector"]
                if selector.get("matchLabels") == {"app.kubernetes.io/part-of": "morphguard"}:
                    names.add("*")
                for expression in selector.get("matchExpressions", []):
                    assert expression["key"] == "app.kubernetes.io/name" and expression["operator"] == "In"
                    names |= set(expression["values"])
        return names

    assert admitted("morphguard-redis", 6379) == {"morphguard-proxy", "morphguard-worker"}
    assert admitted("morphguard-postgres", 5432) == {"morphguard-proxy", "morphguard-worker", "morphguard-review"}
    assert admitted("morphguard-worker", 9091) == {"*"}
    deployments = _named("Deployment")
    for target in ("morphguard-redis", "morphguard-postgres", "morphguard-worker"):
        labels = deployments[target]["spec"]["template"]["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == target  # the policies select the pods the Deployments make


def test_compose_containers_are_hardened():
    services = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
    for name, service in services.items():
        assert service["read_only"] is True, name
        assert service["cap_drop"] == ["ALL"], name
        assert "no-new-privileges:true" in service["security_opt"], name
        assert "/tmp" in service["tmpfs"], name
