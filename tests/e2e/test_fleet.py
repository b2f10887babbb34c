"""The distributed deployment, on real servers: proxy replicas that only enqueue, `morphguard worker`
processes that check, Redis Streams between them and one PostgreSQL audit trail.

Nothing accepted is lost and nothing is recorded twice without a crash to explain it: every request a
replica answered 200 ends as audit rows in the shared store, exactly one each when no process died."""

from __future__ import annotations

import json
import signal
import tempfile
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psycopg
import pytest
import redis
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import ROOT, serve, stop
from tests.forked import Forked, fork_command
from tests.otlp_receiver import OtlpReceiver
from tests.servers import FLEET_KEY

# minutes of real processes each: replicas, workers, Redis and PostgreSQL, with faults injected
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PASSAGE = "Ibuprofen is contraindicated in the third trimester of pregnancy."
QUESTION = "Can pregnant women take ibuprofen for back pain?"
CHECK_KEY = "sk-fleet-check-0123"


def fleet_config(provider: str, redis_url: str, postgres_url: str, *, judge: str = "judge", mode: str = "async",
                 webhook: str = "ok", claim_idle_s: float = 300.0, workers: int = 0) -> dict:
    base = provider.removesuffix("/v1")
    return {
        "judge": {"model": f"openai/{judge}", "api_base": provider, "api_key": "sk-judge", "max_attempts": 1},
        "detector": {"name": "direct"},
        "proxy": {"upstream": {"base_url": provider, "timeout_s": 10}, "mode": mode, "workers": workers,
                  "queue_size": 5000, "shutdown_grace_s": 2},
        "queue": {"url": redis_url, "fleet_key": FLEET_KEY, "stream": f"checks:{uuid.uuid4().hex[:8]}",
                  "claim_idle_s": claim_idle_s},
        "store": {"url": postgres_url},
        "policy": {"profiles": {"general": {"action": "annotate", "escalate": True, "threshold": 0.0,
                                            "topics": {}}},
                   "escalation": {"webhook_url": f"{base}/_webhook/{webhook}", "max_attempts": 100,
                                  "timeout_s": 1, "claim_timeout_s": 8},
                   # unused beside store.url, but the stream journal lies beside it: a folder of the test's own
                   "audit": {"path": str(Path(tempfile.mkdtemp(prefix="fleet-")) / "unused.db")}},
    }


def start_worker(config: dict, folder: Path, concurrency: int = 4, port: int | None = None) -> Forked:
    """`morphguard worker` on `config`, consuming when this returns; with `port`, its probes listen there."""
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    log = folder / "worker.log"
    probes = ["--port", str(port)] if port is not None else []
    process = fork_command(["worker", "--config", str(folder / "config.yaml"), "--concurrency", str(concurrency),
                            *probes], log, ROOT)
    deadline = time.monotonic() + 120
    while "checks at once" not in log.read_text():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"worker did not start:\n{log.read_text()}")
        time.sleep(0.1)
    return process


def audited(postgres_url: str) -> Counter[str]:
    with psycopg.connect(postgres_url) as db:
        return Counter(r[0] for r in db.execute("SELECT request_id FROM decisions"))


def post(base: str, i: int) -> str | None:
    """The request id if the replica accepted the request (200), else None."""
    body = {"model": "hallucinated", "messages": [{"role": "user", "content": f"{QUESTION} ({i})"}],
            "morphguard": {"context": PASSAGE}}
    try:
        response = httpx.post(base + "/v1/chat/completions", json=body, timeout=30)
    except httpx.HTTPError:
        return None  # the replica died with the request: not acknowledged
    if response.status_code != 200:
        return None
    verdict = response.json()["morphguard"]
    assert verdict["reason"] == "queued"
    return str(verdict["request_id"])


def wait_for(ids: set[str], postgres_url: str, timeout: float) -> Counter[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = audited(postgres_url)
        if ids <= set(rows):
            return rows
        time.sleep(0.5)
    return audited(postgres_url)


def folders(tmp_path: Path, n: int, name: str) -> list[Path]:
    out = []
    for i in range(n):
        (tmp_path / f"{name}{i}").mkdir()
        out.append(tmp_path / f"{name}{i}")
    return out


def test_three_replicas_two_workers_500_requests_each_audited_once(provider, redis_url, postgres_url, tmp_path):
    config = fleet_config(provider, redis_url, postgres_url)
    replicas = [serve(config, folder) for folder in folders(tmp_path, 3, "replica")]
    workers = [start_worker(config, folder) for folder in folders(tmp_path, 2, "worker")]
    try:
        bases = [base for base, _ in replicas]
        with ThreadPoolExecutor(24) as pool:
            accepted = [i for i in pool.map(lambda i: post(bases[i % 3], i), range(500)) if i]
        assert len(accepted) == 500
        rows = wait_for(set(accepted), postgres_url, timeout=180)
        ready = httpx.get(bases[0] + "/readyz", timeout=10).json()
    finally:
        for process in workers + [p for _, p in replicas]:
            stop(process)
    assert set(rows) == set(accepted) and max(rows.values()) == 1  # each exactly once: 0 lost, 0 twice
    assert ready["checks"]["queue"] is True and ready["checks"]["store"] is True
    print(f"accepted 500 through 3 replicas, audited {len(rows)} distinct, duplicates 0")


def test_kill_9_of_a_worker_and_of_a_replica_loses_nothing(provider, redis_url, postgres_url, tmp_path):
    # a judge of 3 s per call keeps checks in flight; a dead worker's claims go stale after 4 s
    config = fleet_config(provider, redis_url, postgres_url, judge="slow-judge", claim_idle_s=4)
    replicas = [serve(config, folder) for folder in folders(tmp_path, 2, "replica")]
    victim, survivor = (start_worker(config, folder, concurrency=6) for folder in folders(tmp_path, 2, "worker"))
    try:
        bases = [base for base, _ in replicas]
        with ThreadPoolExecutor(8) as pool:
            first = list(pool.map(lambda i: post(bases[i % 2], i), range(40)))
            time.sleep(2)  # both workers are in the middle of checks
            victim.send_signal(signal.SIGKILL)
            # the second replica dies under load: what it answered 200 was already in Redis
            second = pool.map(lambda i: post(bases[i % 2], i), range(40, 100))
            time.sleep(0.5)
            replicas[1][1].send_signal(signal.SIGKILL)
            accepted = {i for i in [*first, *second] if i}
        assert len(accepted) >= 60
        rows = wait_for(accepted, postgres_url, timeout=240)
    finally:
        for process in [survivor, victim] + [p for _, p in replicas]:
            stop(process)
    lost = accepted - set(rows)
    twice = sum(n - 1 for n in rows.values())
    assert lost == set()
    assert twice <= 6  # at most what the killed worker had in flight: audited, then killed before its ack
    print(f"accepted {len(accepted)}, lost {len(lost)}, recorded twice {twice}")


def test_escalations_with_three_replicas_and_a_webhook_down_then_up_arrive_once(provider, redis_url, postgres_url,
                                                                                tmp_path):
    gate = uuid.uuid4().hex[:8]
    config = fleet_config(provider, redis_url, postgres_url, mode="inline", webhook=f"gate-{gate}", workers=1)
    replicas = [serve(config, folder) for folder in folders(tmp_path, 3, "replica")]
    base_url = provider.removesuffix("/v1")
    try:
        bases = [base for base, _ in replicas]
        with ThreadPoolExecutor(6) as pool:
            flagged = [r for r in pool.map(lambda i: _inline(bases[i % 3], i), range(30)) if r]
        assert len(flagged) == 30  # threshold 0: every checked answer is flagged and escalated
        time.sleep(2)  # every replica retries against the closed webhook
        replicas[2][1].send_signal(signal.SIGKILL)  # its escalations must be taken over by the others
        httpx.post(f"{base_url}/_gate/{gate}", timeout=5)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and _states(postgres_url).get("pending"):
            time.sleep(0.5)
        states = _states(postgres_url)
    finally:
        for _, process in replicas:
            stop(process)
    arrived = Counter(h["body"]["request_id"] for h in httpx.get(f"{base_url}/_webhooks", timeout=5).json()
                      if h["kind"] == f"gate-{gate}")
    assert set(arrived) == set(flagged) and max(arrived.values()) == 1
    assert states == {"delivered": 30}
    print("30 escalations from 3 replicas (one killed while the webhook was down): delivered once each")


def _inline(base: str, i: int) -> str | None:
    body = {"model": "hallucinated", "messages": [{"role": "user", "content": f"{QUESTION} ({i})"}],
            "morphguard": {"context": PASSAGE}}
    verdict = httpx.post(base + "/v1/chat/completions", json=body, timeout=30).json()["morphguard"]
    return str(verdict["request_id"]) if verdict.get("escalated") else None


def _states(postgres_url: str) -> dict[str, int]:
    with psycopg.connect(postgres_url) as db:
        return dict(db.execute("SELECT state, count(*) FROM escalations GROUP BY state").fetchall())


def test_inline_checks_by_the_worker_pool_stay_in_the_callers_trace(provider, redis_url, postgres_url, tmp_path):
    with OtlpReceiver() as receiver:
        def telemetry(service: str) -> dict:
            return {"exporter": "otlp-http", "endpoint": receiver.endpoint, "service_name": service,
                    "metric_interval_s": 1}

        config = fleet_config(provider, redis_url, postgres_url, mode="inline")
        config["policy"]["profiles"]["general"]["latency_budget_s"] = 4
        # The replicas' own judge is unreachable: a check that ran in a replica would fail, not score.
        inline = {**config, "judge": {**config["judge"], "api_base": "http://127.0.0.1:9/v1"},
                  "proxy": {**config["proxy"], "inline_via": "workers"}, "telemetry": telemetry("replica")}
        later = {**config, "proxy": {**config["proxy"], "mode": "async"}, "telemetry": telemetry("replica")}
        (inline_folder, async_folder, worker_folder) = folders(tmp_path, 3, "node")
        inline_base, inline_process = serve(inline, inline_folder)
        async_base, async_process = serve(later, async_folder)
        worker = None
        try:
            alone = _verdict(inline_base, 0)  # no worker yet: the budget runs out, policy's on_error applies
            assert alone["checked"] is False and alone["reason"].endswith("latency_budget_exceeded")
            worker = start_worker({**config, "telemetry": telemetry("worker")}, worker_folder)
            verdicts = [_verdict(inline_base, i) for i in range(1, 6)]
            queued = post(async_base, 99)
            assert wait_for({str(queued)}, postgres_url, timeout=60)[str(queued)] == 1
            time.sleep(3)  # span batches (0.5 s) and a metric export (1 s) from every process
        finally:
            for process in [worker, inline_process, async_process]:
                if process is not None:
                    stop(process)
    assert all(v["checked"] and v["flagged"] and v["score"] is not None for v in verdicts)
    guardrails = {s.attributes.get("morphguard.request_id"): s for s in receiver.named("apply_guardrail morphguard")}
    remote = receiver.named("morphguard.remote_check")
    assert len(remote) == 5
    for span in remote:  # the worker's span is a child of the replica's check span, in the request's trace
        parent = guardrails[span.attributes["morphguard.request_id"]]
        assert parent.resource["service.name"] == "replica" and span.resource["service.name"] == "worker"
        assert span.trace_id == parent.trace_id and span.parent_span_id == parent.span_id
    async_check = guardrails[queued]  # async: the worker's check is its own trace, linked to the request's
    assert async_check.resource["service.name"] == "worker"
    chat = [s for s in receiver.spans if s.resource["service.name"] == "replica" and s.name.startswith("chat ")
            and s.trace_id in async_check.links]
    assert chat
    instances = {r["service.instance.id"] for r, name in receiver.metrics
                 if name == "morphguard.decisions" and r["service.name"] == "worker"}
    assert len(instances) == 1  # the worker's metrics say which worker


def test_a_stream_checked_by_the_workers_asks_the_judge_about_each_sentence_once(provider, redis_url, postgres_url,
                                                                                 tmp_path):
    """A stream checked as it flows by a replica whose checks go to a worker (`inline_via: workers`): each prefix
    check takes the stream's memo along and brings back the worker's verdicts, so the worker asks the judge only
    about sentences no earlier check of the stream asked. The replica's own judge is unreachable."""
    from tests.scripted_llm import asked_sentences

    config = fleet_config(provider, redis_url, postgres_url, judge="judge-100ms", mode="inline")
    config["detector"] = {"name": "sentences"}
    config["policy"]["profiles"]["general"] = {"action": "block", "topics": {}}
    replica_folder, worker_folder = folders(tmp_path, 2, "node")
    # the streams under way are journaled beside the audit trail: in the replica's folder
    config["policy"]["audit"] = {"path": str(replica_folder / "audit.db")}
    replica = {**config, "judge": {**config["judge"], "api_base": "http://127.0.0.1:9/v1"},
               "proxy": {**config["proxy"], "inline_via": "workers"}}
    worker = start_worker(config, worker_folder)
    base, process = serve(replica, replica_folder)
    marker = uuid.uuid4().hex[:8]
    said = [f"Depot {marker} number {n} ships parcels to {town} on weekdays." for n, town in enumerate(
        ("Aldgate", "Bermondsey", "Clapham", "Dalston", "Euston", "Fulham", "Greenwich", "Hackney", "Islington",
         "Kennington", "Lambeth", "Marylebone"))]
    answer = " ".join(said)
    try:
        body = {"model": "echo", "stream": True, "messages": [{"role": "user", "content": answer}],
                "morphguard": {"context": [answer]}}
        with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=60) as response:
            lines = [line for line in response.iter_lines() if line.startswith("data: {")]
    finally:
        for running in (process, worker):
            stop(running)
    chunks = [json.loads(line[6:]) for line in lines]
    text = "".join((c.get("choices") or [{}])[0].get("delta", {}).get("content") or "" for c in chunks)
    assert text == answer and chunks[-1]["morphguard"]["action"] == "pass"
    calls = [r["body"] for r in httpx.get(provider.removesuffix("/v1") + "/_requests", timeout=10).json()
             if "sentences are numbered" in str(r["body"]["messages"][0]["content"])
             and marker in str(r["body"]["messages"][-1]["content"])]
    asked = [sentence for call in calls for _, sentence in asked_sentences(call["messages"][-1]["content"])]
    assert len(calls) >= 3  # checked as it flowed, in several checks, each by the worker
    assert sorted(asked) == sorted(said)  # each sentence asked once


def _verdict(base: str, i: int) -> dict:
    body = {"model": "hallucinated", "messages": [{"role": "user", "content": f"{QUESTION} ({i})"}],
            "morphguard": {"context": PASSAGE}}
    response = httpx.post(base + "/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 200
    return response.json()["morphguard"]


def test_the_fleet_judges_the_same_answer_once(provider, redis_url, postgres_url, tmp_path):
    config = fleet_config(provider, redis_url, postgres_url, mode="inline")
    config["queue"]["cache_ttl_s"] = 60
    (a, b) = folders(tmp_path, 2, "replica")
    replicas = [serve(config, a), serve(config, b)]
    marker = uuid.uuid4().hex[:8]
    try:
        body = {"model": "hallucinated", "messages": [{"role": "user", "content": f"{QUESTION} {marker}"}],
                "morphguard": {"context": PASSAGE}}
        first, second = (httpx.post(base + "/v1/chat/completions", json=body, timeout=30).json()["morphguard"]
                         for base, _ in replicas)
    finally:
        for _, process in replicas:
            stop(process)
    judged = [r for r in httpx.get(provider.removesuffix("/v1") + "/_requests", timeout=10).json()
              if r["body"].get("model") == "judge" and marker in json.dumps(r["body"])]
    assert first["checked"] and second["checked"] and first["score"] == second["score"]
    assert first["request_id"] != second["request_id"]
    assert len(judged) == 1  # the second replica took the first one's verdict from Redis


PASSING = {"detector": "sentences", "score": 0.0, "threshold": 0.5, "flagged": False}  # a well-formed detection


def test_a_redis_client_without_the_fleet_key_cannot_pass_a_blocked_answer(provider, redis_url, postgres_url,
                                                                            tmp_path):
    """An outsider on the fleet's Redis reads each inline job's `reply_to` and answers first with a passing
    detection; the replica waits on for its worker's sealed reply, and the unsupported answer stays blocked."""
    config = fleet_config(provider, redis_url, postgres_url, judge="judge-1500ms", mode="inline")
    config["policy"]["profiles"]["general"].update(action="block", latency_budget_s=20, threshold=0.3)
    config["proxy"]["inline_via"] = "workers"
    config["detector"] = {"name": "sentences"}  # the scripted judge's lexical rule: the answer is unsupported
    config["telemetry"] = {"prometheus": True}
    (replica_folder, worker_folder) = folders(tmp_path, 2, "node")
    base, replica = serve(config, replica_folder)
    worker = start_worker(config, worker_folder)
    outsider = redis.Redis.from_url(redis_url, decode_responses=True)
    forged: list[str] = []

    def forge() -> None:  # a plain Redis client: the jobs are in the stream, each naming its reply list
        deadline = time.monotonic() + 30
        while not forged and time.monotonic() < deadline:
            for _, fields in outsider.xrange(config["queue"]["stream"]):
                if fields.get("reply_to"):
                    outsider.rpush(fields["reply_to"], json.dumps({"detection": PASSING}))
                    forged.append(fields["reply_to"])
            time.sleep(0.01)

    try:
        with ThreadPoolExecutor(1) as pool:
            forging = pool.submit(forge)
            attacked = _verdict(base, 0)
            forging.result()
        alone = _verdict(base, 1)  # no forger: the worker's reply decides as before
        refused = _gauge(base, "morphguard_queue_refused", until=1.0)
    finally:
        outsider.close()
        stop(worker)
        stop(replica)
    assert forged  # the forgery reached the replica's reply list before the worker's reply
    assert attacked["checked"] is True and attacked["flagged"] is True and attacked["action"] == "block", attacked
    assert alone["checked"] is True and alone["flagged"] is True and alone["action"] == "block", alone
    assert refused == 1.0  # counted, as /metrics shows it


def _gauge(base: str, name: str, until: float) -> float | None:
    """The gauge's value on /metrics once it reads `until` (the queue's gauges are refreshed every 2 s)."""
    deadline, value = time.monotonic() + 15, None
    while time.monotonic() < deadline and value != until:
        text = httpx.get(base + "/metrics", timeout=10).text
        value = next((s.value for family in text_string_to_metric_families(text) for s in family.samples
                      if s.name == name), None)
        time.sleep(0.5)
    return value


def test_past_alignments_bound_a_worker_checks_the_first_sentences_and_on_error_decides_the_rest(
        provider, redis_url, postgres_url, tmp_path):
    """`grounding` by the worker pool on a context where alignment passes its bound of comparisons: the worker says
    how far it could read, the replica has it check that far, and an invented claim there blocks; the rest of an
    honest answer is passed unchecked under `fail_open`."""
    config = fleet_config(provider, redis_url, postgres_url, mode="inline")
    config["proxy"].update(inline_via="workers", keys=[CHECK_KEY])
    config["detector"] = {"name": "grounding"}
    config["policy"]["profiles"]["general"].update(action="block", on_error="fail_open", escalate=False,
                                                   threshold=0.5)
    (replica_folder, worker_folder) = folders(tmp_path, 2, "node")
    base, replica = serve(config, replica_folder)
    worker = start_worker(config, worker_folder)
    context = " ".join(f"Alpha {'beta' if n % 2 else 'gamma'} {n}." for n in range(4_000))
    tail = " ".join(["Alpha beta gamma."] * 100)
    try:
        verdicts = [httpx.post(base + "/v1/check", json={"question": "Alpha?", "context": [context], "answer": answer},
                               headers={"authorization": f"Bearer {CHECK_KEY}"}, timeout=60).json()
                    for answer in ("Zeta Corporation bought Omega Industries for 9,999 dollars in Berlin. " + tail,
                                   tail)]
    finally:
        stop(worker)
        stop(replica)
    invented, honest = verdicts
    assert (invented["action"], invented["flagged"], invented["reason"]) == (
        "block", True, "read in part: check_too_large"), invented
    assert (honest["action"], honest["reason"], honest["unchecked"]) == ("pass", "fail_open: check_too_large", True)
    assert honest["checked"] is True and honest["score"] is not None  # the first sentences were read
