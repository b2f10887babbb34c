#!/usr/bin/env bash
# Build and run what ships, as a team would adopt it, and send RAG requests through each:
#   1. the wheel, installed into a clean venv: `morphguard demo --help`, `morphguard check` with grounding;
#   2. the image (Containerfile), its health check;
#   3. the compose fleet (compose.yaml: 2 replicas, worker, Redis, PostgreSQL, console, scripted upstream): a
#      supported and an unsupported answer through each replica, their verdicts and audit rows;
#   4. the Kubernetes manifests under `podman kube play`, as far as podman runs them: one RAG request, and the
#      containers' hardening (read-only root, no capabilities, no privilege escalation) as podman applied it.
# The fleet's secrets are generated first (deploy/secrets.sh; files already there are kept).
# Everything listens on loopback or podman's own network and is removed at the end, by name.
#
# Usage, from the repository root: bash deploy/smoke.sh      (root, with podman, runc, debootstrap installed)
# Machines that reach no image registry build the Debian base with debootstrap from the mirror apt uses, and
# stand-ins for the Redis and PostgreSQL images from Debian's packages (deploy/standins/).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
work="$(mktemp -d)"
started=$SECONDS
step() { printf '\n== %s (%ds)\n' "$1" $((SECONDS - started)); }

# Podman, configured for this run only: runc (crun refuses hybrid cgroups on some hosts) and open-file limits
# within root's hard limits.
cat > "$work/containers.conf" <<'CONF'
[containers]
default_ulimits = ["nofile=16384:16384", "nproc=16384:16384"]
[engine]
runtime = "runc"
CONF
export CONTAINERS_CONF="$work/containers.conf"
# pip in a build trusts the host's CA bundle when there is one (registries behind a TLS-inspecting proxy)
secret=()
if [ -s /etc/ssl/certs/ca-certificates.crt ]; then
    secret=(--secret id=pipcert,src=/etc/ssl/certs/ca-certificates.crt)
fi

compose_file="$root/deploy/compose.yaml"
kube_all="$work/kube.yaml"
cleanup() {
    set +e
    if [ -x "$work/tools/bin/podman-compose" ]; then
        "$work/tools/bin/podman-compose" -f "$compose_file" down -v >/dev/null 2>&1
    fi
    [ -f "$kube_all" ] && podman kube down "$kube_all" >/dev/null 2>&1
    podman secret rm morphguard-secrets >/dev/null 2>&1
    podman network rm -f morphguard-kube >/dev/null 2>&1
    rm -rf "$work"
}
trap cleanup EXIT

step "wheel: build, install into a clean venv"
python3 -m venv "$work/build"
"$work/build/bin/pip" wheel -q --no-deps --wheel-dir "$work/dist" .
python3 -m venv "$work/clean"
"$work/clean/bin/pip" install -q "$work"/dist/morphguard-*.whl
ls "$work"/dist
(cd "$work" && ./clean/bin/morphguard demo --help | head -n 1)
for asset in detectors/combined.json detectors/prompts policy/migrations/versions review/templates review/static; do
    "$work/clean/bin/python" - "$asset" <<'PY'
import sys
from importlib.resources import files
assert files("morphguard").joinpath(sys.argv[1]).is_file() or files("morphguard").joinpath(sys.argv[1]).is_dir(), sys.argv[1]
PY
done
(cd "$work" && ./clean/bin/morphguard check --detector grounding -q "When does the museum open?" \
    -c "The museum opens at nine." -a "The museum opens at nine.")
set +e
(cd "$work" && ./clean/bin/morphguard check --detector grounding -q "When does the museum open?" \
    -c "The museum opens at nine." -a "The museum opens at six on Sundays and entry is free.")
flagged=$?
set -e
[ "$flagged" = 1 ] || { echo "check of an unsupported answer exited $flagged, not 1 (flagged)"; exit 1; }

step "base image"
if ! podman image exists localhost/debian:bookworm; then
    mirror="$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n 1)"
    mirror="${mirror:-$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list 2>/dev/null)}"
    debootstrap --variant=minbase bookworm "$work/rootfs" "${mirror:-http://deb.debian.org/debian}" >/dev/null
    tar -C "$work/rootfs" -c . | podman import - localhost/debian:bookworm >/dev/null
    rm -rf "$work/rootfs"
fi

step "images: morphguard, and the Redis and PostgreSQL stand-ins"
build=(podman build -q --format docker --pull=never --build-arg BASE=localhost/debian:bookworm)
"${build[@]}" "${secret[@]}" -t localhost/morphguard:latest . >/dev/null
"${build[@]}" -f deploy/standins/redis.Containerfile -t localhost/morphguard-standin/redis:7 deploy/standins >/dev/null
"${build[@]}" -f deploy/standins/postgres.Containerfile -t localhost/morphguard-standin/postgres:15 deploy/standins >/dev/null
podman images --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E 'morphguard' || true
podman run --rm --entrypoint sh localhost/morphguard:latest -c \
    'id -un; ! command -v gcc && ! command -v cc && echo "no compiler"; morphguard --help | head -n 1'

python3 -m venv "$work/tools"
"$work/tools/bin/pip" install -q podman-compose

sh deploy/secrets.sh
proxy_key="$(sed -n 's/^MORPHGUARD_PROXY_KEY=//p' deploy/secrets.env)"
# A RAG request through a proxy at $1; $2: the question. Prints the response body.
ask() {
    curl -sS -m 30 "$1/v1/chat/completions" -H 'content-type: application/json' -H "authorization: Bearer $proxy_key" \
        -d "{\"model\": \"scripted\", \"messages\": [
              {\"role\": \"system\", \"content\": \"Answer from <context>The museum is closed on Mondays. It opens at nine on other days.</context>\"},
              {\"role\": \"user\", \"content\": \"$2\"}]}"
}
# The verdict of a response body on stdin must be flagged ($1: true/false); prints its request id.
verdict() {
    python3 -c '
import json, sys
body = json.load(sys.stdin)
verdict = body["morphguard"]
assert verdict["checked"] is True, verdict
assert verdict["flagged"] is (sys.argv[1] == "true"), verdict
print(verdict["request_id"], verdict["action"], verdict["score"], file=sys.stderr)
print(verdict["request_id"])' "$1"
}
wait_ready() {
    for _ in $(seq 1 90); do
        if curl -fsS -m 2 "$1/readyz" >/dev/null 2>&1; then return 0; fi
        sleep 1
    done
    echo "$1 not ready"; return 1
}

step "compose fleet: up"
export MORPHGUARD_IMAGE=localhost/morphguard:latest
export REDIS_IMAGE=localhost/morphguard-standin/redis:7 POSTGRES_IMAGE=localhost/morphguard-standin/postgres:15
"$work/tools/bin/podman-compose" -f "$compose_file" up -d >/dev/null 2>&1
wait_ready http://127.0.0.1:8080 && wait_ready http://127.0.0.1:8081
ids=()
for port in 8080 8081; do
    ids+=("$(ask "http://127.0.0.1:$port" "Is the museum open on Mondays?" | verdict false)")
    ids+=("$(ask "http://127.0.0.1:$port" "Careless: when does it open on Sundays?" | verdict true)")
done
podman healthcheck run morphguard_proxy-1_1 && echo "proxy-1 healthy"
podman healthcheck run morphguard_worker_1 && echo "worker healthy"
code="$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8090/)"
[ "$code" = 303 ] || [ "$code" = 200 ] || { echo "review console answered $code"; exit 1; }
echo "review console: $code"
code="$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8080/v1/chat/completions -H 'content-type: application/json' \
    -H 'authorization: Bearer sk-not-the-proxy-key' -d '{"model": "scripted", "messages": [{"role": "user", "content": "hi"}]}')"
[ "$code" = 401 ] || { echo "a request without the proxy key got $code, not 401"; exit 1; }
echo "a request without the proxy key: $code"
podman exec morphguard_redis_1 redis-cli ping | grep -q NOAUTH || { echo "redis answered without its password"; exit 1; }
echo "redis without its password: NOAUTH"
podman exec morphguard_proxy-1_1 morphguard audit --format jsonl --config /etc/morphguard/config.yaml \
    > "$work/audit.jsonl"
python3 - "$work/audit.jsonl" "${ids[@]}" <<'PY'
import json, sys
rows = {row["request_id"]: row for row in map(json.loads, open(sys.argv[1]))}
for request_id in sys.argv[2:]:
    row = rows[request_id]
    print("audit row:", request_id, row["action"], row["flagged"], row["detector"])
PY
"$work/tools/bin/podman-compose" -f "$compose_file" down -v >/dev/null 2>&1

step "Kubernetes manifests: podman kube play"
# What podman runs of them: no Services (a pod is found by its pod's name), one proxy replica (podman publishes
# each container port on the host), no NetworkPolicies, and the Secret (kustomize's secretGenerator of secrets.env)
# given as podman's flat JSON of base64 values (podman 4.3).
podman tag localhost/morphguard-standin/redis:7 docker.io/library/redis:7-bookworm
podman tag localhost/morphguard-standin/postgres:15 docker.io/library/postgres:15-bookworm
"$work/clean/bin/python" - deploy/kubernetes "$kube_all" "$work/secret.json" <<'PY'
import base64, json, sys
from pathlib import Path

import yaml

folder, out, secret_out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
docs = [d for name in kustomization["resources"] for d in yaml.safe_load_all((folder / name).read_text()) if d]
hosts = {d["metadata"]["name"]: d["metadata"]["name"] + "-pod-0" for d in docs if d["kind"] == "Deployment"}
(generated,) = kustomization["secretGenerator"]
lines = [line.partition("=") for name in generated["envs"] for line in (folder / name).read_text().splitlines()]
secret_out.write_text(json.dumps({k: base64.b64encode(v.encode()).decode() for k, _, v in lines if k}))
kept = []
for doc in docs:
    if doc["kind"] in ("ConfigMap", "Deployment"):
        if doc["kind"] == "Deployment":
            doc["spec"]["replicas"] = 1
            for container in doc["spec"]["template"]["spec"]["containers"]:
                for env in container.get("env", []):
                    for service, pod in hosts.items():
                        if isinstance(env.get("value"), str) and env["value"].split("//")[-1].split(":")[0] == service:
                            env["value"] = env["value"].replace(service, pod)
        kept.append(doc)
out.write_text(yaml.safe_dump_all(kept))
PY
podman secret create morphguard-secrets "$work/secret.json" >/dev/null
proxy_key="$(sed -n 's/^MORPHGUARD_PROXY_KEY=//p' deploy/kubernetes/secrets.env)"  # the Secret's, not compose's
podman network create morphguard-kube >/dev/null
podman kube play --network morphguard-kube "$kube_all" >/dev/null 2>&1
ip_of() { podman inspect "$1" --format '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}'; }
worker="http://$(ip_of morphguard-worker-pod-0-worker):9091" proxy="http://$(ip_of morphguard-proxy-pod-0-proxy):8080"
# Pods start in no order: the proxy may answer /readyz before the worker that checks its requests is up (until then a
# request waits for a verdict, up to the judge's timeout), so both are waited for, as a Service's endpoints would be.
# On failure, what the pods printed.
if ! { wait_ready "$worker" && wait_ready "$proxy" &&
       ask "$proxy" "Careless: when does it open on Sundays?" | verdict true >/dev/null; }; then
    for container in morphguard-proxy-pod-0-proxy morphguard-worker-pod-0-worker; do
        echo "-- $container"; podman logs --tail 40 "$container" 2>&1
    done
    exit 1
fi
# The hardening as podman applied it, container by container; the exec probes of Redis and PostgreSQL, run once.
# (Podman 4.3 turns an httpGet probe into curl inside the container, which the morphguard image does not have.)
podman healthcheck run morphguard-redis-pod-0-redis
podman healthcheck run morphguard-postgres-pod-0-postgres
echo "redis and postgres probes: healthy"
for container in $(podman ps --format '{{.Names}}' | grep -E '^morphguard-.*-pod-0-'); do
    podman inspect "$container" --format \
        "$container: read-only root {{.HostConfig.ReadonlyRootfs}}, caps {{.EffectiveCaps}}, {{.HostConfig.SecurityOpt}}, user {{.Config.User}}, memory limit {{.HostConfig.Memory}}"
    [ "$(podman inspect "$container" --format '{{.HostConfig.ReadonlyRootfs}}')" = true ] \
        || { echo "$container: root file system writable"; exit 1; }
    [ -z "$(podman inspect "$container" --format '{{range .EffectiveCaps}}{{.}}{{end}}')" ] \
        || { echo "$container: capabilities kept"; exit 1; }
done
podman kube down "$kube_all" >/dev/null 2>&1

step "done"
