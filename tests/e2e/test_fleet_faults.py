"""The fleet through the faults an operator meets, on real servers: 2 proxy replicas that only enqueue,
2 `morphguard worker`s, Redis Streams between them, one PostgreSQL audit trail, an escalation webhook
for every checked answer. Requests arrive at a steady few per second while the test stops, kills or
closes one dependency for a while and brings it back.

Whatever the fault: no client gets a 5xx, every request a replica answered 200 ends as exactly one audit
row, and every escalated row reaches the webhook exactly once."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.e2e.conftest import serve, stop
from tests.e2e.test_fleet import PASSAGE, QUESTION, fleet_config, folders, start_worker
from tests.servers import RedisServer, fresh_database

# minutes of real processes each: replicas, workers, Redis and PostgreSQL, with faults injected
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REQUESTS = 80
PER_SECOND = 4.0
FAULT_AT_S = 5.0  # into the load
OUTAGE_S = 8.0


@dataclass
class Outcome:
    statuses: Counter[int]
    accepted: set[str]
    rows: Counter[str]  # request id → audit rows
    escalated: set[str]  # request ids whose row says escalated
    webhooks: Counter[str]  # request id → deliveries the webhook took

    def report(self, fault: str) -> str:
        lost = self.accepted - set(self.rows)
        twice = sum(n - 1 for n in self.rows.values())
        return (f"{fault}: accepted {len(self.accepted)}/{REQUESTS}, client errors "
                f"{sum(n for s, n in self.statuses.items() if s != 200)} ({dict(self.statuses)}), lost {len(lost)}, "
                f"duplicated rows {twice}, escalations delivered {len(self.webhooks)}/{len(self.escalated)}, "
                f"duplicated escalations {sum(n - 1 for n in self.webhooks.values())}")

    def assert_nothing_lost_or_doubled(self) -> None:
        assert not [s for s in self.statuses if s >= 500]
        assert self.accepted - set(self.rows) == set()  # every accepted request has its row
        assert max(self.rows.values()) == 1  # and only one
        assert self.webhooks == Counter(self.escalated)  # every escalation once, none for an unrecorded decision


def send(base: str, i: int, marker: str) -> tuple[int, str | None]:
    body = {"model": "hallucinated", "messages": [{"role": "user", "content": f"{QUESTION} ({marker} {i})"}],
            "morphguard": {"context": PASSAGE}}
    try:
        response = httpx.post(base + "/v1/chat/completions", json=body, timeout=60)
    except httpx.HTTPError:
        return 0, None
    if response.status_code != 200:
        return response.status_code, None
    return 200, str(response.json()["morphguard"]["request_id"])


def load_with_fault(bases: list[str], inject: Callable[[], None], restore: Callable[[], None],
                    outage_s: float = OUTAGE_S) -> tuple[Counter[int], set[str]]:
    """REQUESTS at PER_SECOND over the replicas in turn; `inject` FAULT_AT_S in, `restore` `outage_s` later."""
    marker = uuid.uuid4().hex[:8]

    def fault() -> None:
        time.sleep(FAULT_AT_S)
        inject()
        time.sleep(outage_s)
        restore()

    injector = threading.Thread(target=fault)
    started = time.monotonic()
    injector.start()
    with ThreadPoolExecutor(24) as pool:
        futures = []
        for i in range(REQUESTS):
            time.sleep(max(0.0, started + i / PER_SECOND - time.monotonic()))
            futures.append(pool.submit(send, bases[i % len(bases)], i, marker))
        results = [f.result() for f in futures]
    injector.join()
    return Counter(status for status, _ in results), {rid for status, rid in results if rid is not None}


def settle(accepted: set[str], statuses: Counter[int], postgres_url: str, provider: str, webhook: str,
           timeout: float = 60) -> Outcome:
    """Wait until every accepted request is recorded and every escalation delivered (or `timeout`)."""
    deadline = time.monotonic() + timeout
    while True:
        rows, escalated = _decisions(postgres_url)
        webhooks = Counter(h["body"]["request_id"] for h in httpx.get(provider.removesuffix("/v1") + "/_webhooks",
                                                                      timeout=10).json()
                           if h["kind"] == webhook and h["body"]["request_id"] in rows)
        done = accepted <= set(rows) and set(webhooks) >= escalated
        if done or time.monotonic() > deadline:
            return Outcome(statuses, accepted, rows, escalated, webhooks)
        time.sleep(0.5)


def _decisions(postgres_url: str) -> tuple[Counter[str], set[str]]:
    with psycopg.connect(postgres_url) as db:
        found = db.execute("SELECT request_id, escalated FROM decisions").fetchall()
    return Counter(r for r, _ in found), {r for r, escalated in found if escalated}


@contextmanager
def fleet(config: dict, tmp_path: Path) -> Iterator[list[str]]:
    """2 replicas and 2 workers on `config`; the replicas' base URLs."""
    with ThreadPoolExecutor(4) as pool:  # started side by side: each takes seconds to import and connect
        replicas = [pool.submit(serve, config, folder) for folder in folders(tmp_path, 2, "replica")]
        workers = [pool.submit(start_worker, config, folder, 1) for folder in folders(tmp_path, 2, "worker")]
        started = [f.result() for f in replicas], [f.result() for f in workers]
    try:
        yield [base for base, _ in started[0]]
    finally:
        for process in started[1] + [p for _, p in started[0]]:
            stop(process)


def faulty_config(provider: str, redis_url: str, postgres_url: str, webhook: str = "ok") -> dict:
    # A judge of 0.7 s and one check at a time per worker: the workers fall behind, checks wait in the queue.
    config = fleet_config(provider, redis_url, postgres_url, judge="judge-700ms", webhook=webhook, claim_idle_s=10)
    config["proxy"]["on_queue_full"] = "inline"  # a replica that cannot queue checks the answer itself
    config["policy"]["escalation"]["max_attempts"] = 4
    return config


@pytest.fixture
def redis(tmp_path) -> Iterator[RedisServer]:
    (tmp_path / "redis").mkdir()
    server = RedisServer(tmp_path / "redis")
    server.start()
    yield server
    server.stop()


def test_postgres_stopped_then_started(provider, redis_url, postgres, tmp_path):
    database = fresh_database(postgres.url, "faults")
    with fleet(faulty_config(provider, redis_url, database), tmp_path) as bases:
        statuses, accepted = load_with_fault(bases, postgres.stop, postgres.start)
        outcome = settle(accepted, statuses, database, provider, "ok")
    print(outcome.report("PostgreSQL stopped 8 s"))
    assert len(accepted) == REQUESTS
    outcome.assert_nothing_lost_or_doubled()


def test_redis_stopped_then_started_with_its_data(provider, redis, postgres_url, tmp_path):
    with fleet(faulty_config(provider, redis.url, postgres_url), tmp_path) as bases:
        statuses, accepted = load_with_fault(bases, redis.stop, redis.start)
        outcome = settle(accepted, statuses, postgres_url, provider, "ok")
    print(outcome.report("Redis stopped 8 s, back with its data"))
    assert len(accepted) == REQUESTS
    outcome.assert_nothing_lost_or_doubled()


def test_redis_killed_then_started_without_its_data(provider, redis, postgres_url, tmp_path):
    with fleet(faulty_config(provider, redis.url, postgres_url), tmp_path) as bases:
        statuses, accepted = load_with_fault(bases, lambda: redis.kill(lose_data=True), redis.start)
        outcome = settle(accepted, statuses, postgres_url, provider, "ok")
    print(outcome.report("Redis killed, back empty after 8 s"))
    assert len(accepted) == REQUESTS
    outcome.assert_nothing_lost_or_doubled()


def test_webhook_down_then_up(provider, redis_url, postgres_url, tmp_path):
    gate = uuid.uuid4().hex[:8]
    base_url = provider.removesuffix("/v1")
    with fleet(faulty_config(provider, redis_url, postgres_url, webhook=f"gate-{gate}"), tmp_path) as bases:
        # closed from the start; open once the load has run FAULT_AT_S + OUTAGE_S + 10 s
        statuses, accepted = load_with_fault(bases, lambda: time.sleep(10),
                                             lambda: httpx.post(f"{base_url}/_gate/{gate}", timeout=5))
        outcome = settle(accepted, statuses, postgres_url, provider, f"gate-{gate}")
    print(outcome.report("webhook down 23 s"))
    assert len(accepted) == REQUESTS and len(outcome.escalated) == REQUESTS
    outcome.assert_nothing_lost_or_doubled()


def test_a_lock_on_the_decisions_table_longer_than_a_claim(provider, redis_url, postgres_url, tmp_path):
    """Rows cannot be written for 15 s, past `claim_idle_s` (10 s): the checks waiting on the store keep their
    claims, so none is taken over and run twice, and every row is written once the lock goes."""
    holder: dict[str, psycopg.Connection] = {}

    def lock() -> None:
        holder["db"] = psycopg.connect(postgres_url)
        holder["db"].execute("LOCK TABLE decisions IN ACCESS EXCLUSIVE MODE")  # held until the transaction ends

    def unlock() -> None:
        holder["db"].rollback()
        holder["db"].close()

    with fleet(faulty_config(provider, redis_url, postgres_url), tmp_path) as bases:
        statuses, accepted = load_with_fault(bases, lock, unlock, outage_s=15.0)
        outcome = settle(accepted, statuses, postgres_url, provider, "ok")
    print(outcome.report("a lock on decisions for 15 s"))
    assert len(accepted) == REQUESTS
    outcome.assert_nothing_lost_or_doubled()

