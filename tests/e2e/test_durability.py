"""Nothing accepted is lost: kill -9 the proxy under async load, start it again on the same store, and
every accepted request ends audited exactly once (checked, or not checked with its reason); escalations
waiting for a down webhook at the kill are delivered after the restart."""

from __future__ import annotations

import signal
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.e2e.conftest import serve, stop

# kill -9 under load, and a queue filled to overflow: a minute of real processes each
pytestmark = pytest.mark.slow

PASSAGE = "Ibuprofen is contraindicated in the third trimester of pregnancy."
QUESTION = "Can pregnant women take ibuprofen for back pain?"


def config(provider: str, folder, judge: str, webhook: str) -> dict:
    base = provider.removesuffix("/v1")
    return {
        "judge": {"model": f"openai/{judge}", "api_base": provider, "api_key": "sk-judge", "max_attempts": 1},
        "detector": {"name": "direct"},
        "proxy": {"upstream": {"base_url": provider, "timeout_s": 5}, "mode": "async", "workers": 2,
                  "queue_size": 1000, "shutdown_grace_s": 1},
        "policy": {"profiles": {"general": {"action": "annotate", "escalate": True, "threshold": 0.0,
                                            "topics": {}}},
                   "escalation": {"webhook_url": f"{base}/_webhook/{webhook}", "max_attempts": 50},
                   "audit": {"path": str(folder / "audit.db")}},
    }


def rows(folder) -> list[tuple[str, int, str | None]]:
    with sqlite3.connect(folder / "audit.db") as db:
        return db.execute("SELECT request_id, checked, reason FROM decisions").fetchall()


def outbox(folder) -> dict[str, int]:
    with sqlite3.connect(folder / "audit.db") as db:
        return dict(db.execute("SELECT state, count(*) FROM escalations GROUP BY state").fetchall())


def post(base: str, i: int) -> str:
    body = {"model": "hallucinated", "messages": [{"role": "user", "content": f"{QUESTION} ({i})"}],
            "morphguard": {"context": PASSAGE}}
    response = httpx.post(base + "/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 200
    verdict = response.json()["morphguard"]
    assert verdict["reason"] == "queued"
    return verdict["request_id"]


def test_kill_9_under_async_load_loses_nothing(provider, tmp_path):
    n = 200
    # first life: a judge that takes 3 s per call, so most checks are still queued at the kill
    base, process = serve(config(provider, tmp_path, "slow-judge", "down"), tmp_path)
    with ThreadPoolExecutor(16) as pool:
        accepted = list(pool.map(lambda i: post(base, i), range(n)))
    time.sleep(4)  # a few checks finish and escalate to the down webhook
    process.send_signal(signal.SIGKILL)
    process.wait()
    before = rows(tmp_path)
    pending_escalations = outbox(tmp_path).get("pending", 0)
    assert len(before) < n  # the kill did interrupt the work
    # second life: the same store, a fast judge and a webhook that is up
    base, process = serve(config(provider, tmp_path, "judge", "ok"), tmp_path)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (len({r[0] for r in rows(tmp_path)}) < n
                                               or outbox(tmp_path).get("pending")):
            time.sleep(0.5)
    finally:
        stop(process)
    after = rows(tmp_path)
    ids = [r[0] for r in after]
    assert set(ids) == set(accepted)  # accepted = checked + recorded as not checked: 0 lost
    assert len(ids) - len(set(ids)) <= 2  # at-least-once: a check cut by the kill may have been recorded twice
    final = outbox(tmp_path)
    assert final.get("pending", 0) == 0
    if pending_escalations:
        delivered = [h for h in httpx.get(provider.removesuffix("/v1") + "/_webhooks").json() if h["kind"] == "ok"]
        assert len(delivered) >= pending_escalations
    print(f"accepted {n}, audited before restart {len(before)}, after {len(set(ids))} "
          f"(duplicates {len(ids) - len(set(ids))}); escalations pending at kill {pending_escalations}, "
          f"outbox now {final}")


@pytest.mark.parametrize("on_full", ["drop"])
def test_a_full_queue_records_what_it_cannot_take(provider, tmp_path, on_full):
    cfg = config(provider, tmp_path, "slow-judge", "down")
    cfg["proxy"] |= {"queue_size": 3, "workers": 1, "on_queue_full": on_full}
    base, process = serve(cfg, tmp_path)
    try:
        reasons = []
        for _ in range(8):
            body = {"model": "hallucinated", "messages": [{"role": "user", "content": QUESTION}],
                    "morphguard": {"context": PASSAGE}}
            verdict = httpx.post(base + "/v1/chat/completions", json=body, timeout=30).json()["morphguard"]
            reasons.append(verdict["reason"])
        assert "queue_full" in reasons
        full = [r for r in rows(tmp_path) if r[2] == "queue_full"]
        assert len(full) == reasons.count("queue_full")
    finally:
        stop(process)


@pytest.mark.parametrize("stream_mode", ["passthrough", "incremental"])
def test_streams_cut_by_a_kill_9_are_recorded_as_interrupted_by_the_next_start(provider, tmp_path, stream_mode):
    cfg = config(provider, tmp_path, "judge", "ok")
    cfg["proxy"] |= {"mode": "inline", "stream_mode": stream_mode}
    base, process = serve(cfg, tmp_path)
    received: list[int] = []

    def read_stream() -> None:
        body = {"model": "slow-stream", "stream": True, "messages": [{"role": "user", "content": QUESTION}],
                "morphguard": {"context": PASSAGE}}
        got = 0
        try:
            with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=30) as response:
                for line in response.iter_lines():
                    got += len(line)
        except httpx.HTTPError:
            pass  # cut by the kill
        received.append(got)

    streams = [threading.Thread(target=read_stream) for _ in range(3)]
    for thread in streams:
        thread.start()
    time.sleep(1.8)  # a few words of each answer out (a word every 0.5 s)
    process.send_signal(signal.SIGKILL)
    process.wait()
    for thread in streams:
        thread.join(timeout=30)
    assert all(received) and rows(tmp_path) == []  # the clients had text, and no stream had its row
    base, process = serve(cfg, tmp_path)  # the next start on the same trail
    stop(process)
    with sqlite3.connect(tmp_path / "audit.db") as db:
        found = db.execute("SELECT checked, reason, released_chars, escalated FROM decisions").fetchall()
    assert len(found) == 3 and all(r[:2] == (0, "fail_open: stream_interrupted") for r in found)
    assert all(r[3] for r in found) and outbox(tmp_path)  # the profile escalates: so does each interrupted stream
    if stream_mode == "passthrough":  # text went out unchecked as it came: the row says how much
        assert all(r[2] > 0 for r in found)
