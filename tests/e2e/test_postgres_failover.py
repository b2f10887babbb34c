"""The store follows a promoted standby: `morphguard serve` on a PostgreSQL primary and its streaming standby,
named together in one multi-host `store.url` (`target_session_attrs=read-write`, as docs/deployment.md gives it).
Requests flow while the primary is stopped and the standby promoted.

No client is answered 200 without its row on the server that now takes writes; between the two the proxy refuses
with the documented 503 `store_unavailable` and `Retry-After`, never another 5xx; it answers 200 again soon after
the promotion, with no restart; the rows written before the failover are on the new primary, and so are the rows
owed for the refused requests."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.e2e.conftest import serve, stop
from tests.servers import PostgresServer, fresh_database

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

PASSAGE = "Ibuprofen is contraindicated in the third trimester of pregnancy."
QUESTION = "Can pregnant women take ibuprofen for back pain?"
BEFORE = 10  # requests answered by the primary before the failover
CLIENTS = 2
PAUSE_S = 0.1  # between one client's requests
FAULT_AT_S = 2.0  # into the load: the primary stops
PROMOTE_AFTER_S = 3.0  # then the standby, read-only meanwhile, is promoted (a failover manager's detection time)
AFTER_S = 10.0  # of load after the promotion
RECOVER_WITHIN_S = 10.0  # from the promotion to the first 200 that needed the new primary
ROWS_OWED_WITHIN_S = 20.0


@pytest.fixture
def primary_and_standby() -> Iterator[tuple[PostgresServer, PostgresServer]]:
    primary = PostgresServer()
    standby: PostgresServer | None = None
    try:
        primary.start()
        fresh_database(primary.url, "failover")
        standby = PostgresServer(primary=primary)
        standby.start()
        yield primary, standby
    finally:
        primary.remove()
        if standby is not None:
            standby.remove()


def config(provider: str, store_url: str, folder: Path) -> dict:
    return {
        "judge": {"model": "openai/judge", "api_base": provider, "api_key": "sk-judge", "max_attempts": 1},
        "detector": {"name": "direct"},
        "proxy": {"upstream": {"base_url": provider, "timeout_s": 5}, "mode": "inline", "shutdown_grace_s": 1},
        "store": {"url": store_url},
        "policy": {"profiles": {"general": {"action": "annotate", "escalate": False, "threshold": 0.5,
                                            "topics": {}}},
                   "audit": {"path": str(folder / "unused.db"), "store_text": "full", "keep_text": "none",
                             "wait_s": 1.0}},
    }


def ask(http: httpx.Client, base: str, marker: str) -> httpx.Response:
    body = {"model": "faithful", "messages": [{"role": "user", "content": f"{QUESTION} {marker}"}],
            "morphguard": {"context": PASSAGE}}
    return http.post(base + "/v1/chat/completions", json=body)


def rows(url: str) -> dict[str, str]:
    """request id → question, of every row on the server at `url`."""
    with psycopg.connect(url, connect_timeout=5) as db:
        return {str(r[0]): str(r[1]) for r in db.execute("SELECT request_id, question FROM decisions")}


def wait_for_replay(primary: PostgresServer) -> None:
    """Until the standby has replayed everything the primary has written."""
    deadline = time.monotonic() + 30
    with psycopg.connect(primary.url, autocommit=True) as db:
        while True:
            caught_up = db.execute("SELECT count(*) > 0 AND bool_and(replay_lsn >= pg_current_wal_lsn()) "
                                   "FROM pg_stat_replication").fetchone()
            if caught_up and caught_up[0]:
                return
            assert time.monotonic() < deadline, "the standby did not catch up"
            time.sleep(0.1)


@dataclass
class Load:
    statuses: Counter[int] = field(default_factory=Counter)
    answered: dict[str, str] = field(default_factory=dict)  # request id → marker, of the 200s
    refused: list[str] = field(default_factory=list)  # markers of the 503 store_unavailable
    bad: list[str] = field(default_factory=list)  # any other failure, and a 503 without Retry-After
    # (monotonic times the request was sent and answered, status)
    times: list[tuple[float, float, int]] = field(default_factory=list)


def load(base: str, until: float) -> Load:
    run, lock = Load(), threading.Lock()

    def client() -> None:
        with httpx.Client(timeout=30) as http:
            while time.monotonic() < until:
                marker, sent = uuid.uuid4().hex, time.monotonic()
                try:
                    response = ask(http, base, marker)
                except httpx.HTTPError as exc:
                    with lock:
                        run.statuses[0] += 1
                        run.bad.append(f"{type(exc).__name__}: {exc}")
                    continue
                with lock:
                    run.statuses[response.status_code] += 1
                    run.times.append((sent, time.monotonic(), response.status_code))
                    if response.status_code == 200:
                        run.answered[str(response.json()["morphguard"]["request_id"])] = marker
                    elif (response.status_code == 503 and response.headers.get("retry-after")
                          and response.json()["error"]["code"] == "store_unavailable"):
                        run.refused.append(marker)
                    else:
                        run.bad.append(f"{response.status_code} {response.headers.get('retry-after')} "
                                       f"{response.text[:200]}")
                time.sleep(PAUSE_S)

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return run


# read-write: the URL docs/deployment.md gives, which skips the standby until it is promoted. any: the driver takes
# the first host that answers, the standby while it is read-only; its refusals are an outage, never a dropped row.
@pytest.mark.parametrize("session", ["read-write", "any"])
def test_the_store_follows_a_promoted_standby(provider, primary_and_standby, tmp_path, session):
    primary, standby = primary_and_standby
    new_primary_url = standby.url.rsplit("/", 1)[0] + "/failover"
    store_url = (f"postgresql://morphguard@/failover?host=127.0.0.1:{primary.port}&host=127.0.0.1:{standby.port}"
                 f"&target_session_attrs={session}&connect_timeout=2")
    base, process = serve(config(provider, store_url, tmp_path), tmp_path)
    try:
        with httpx.Client(timeout=30) as http:
            before = [str(ask(http, base, f"before-{i}").raise_for_status().json()["morphguard"]["request_id"])
                      for i in range(BEFORE)]
        assert set(before) <= set(rows(primary.url.rsplit("/", 1)[0] + "/failover"))
        wait_for_replay(primary)

        stopped, promoted = [], []

        def failover() -> None:
            time.sleep(FAULT_AT_S)
            primary.stop()  # fast shutdown: its sessions end, the standby has every record it streamed
            stopped.append(time.monotonic())
            time.sleep(PROMOTE_AFTER_S)
            standby.promote()
            promoted.append(time.monotonic())

        fault = threading.Thread(target=failover)
        fault.start()
        run = load(base, until=time.monotonic() + FAULT_AT_S + PROMOTE_AFTER_S + AFTER_S)
        fault.join()

        after = rows(new_primary_url)
        assert run.bad == []  # no 5xx but the documented 503, no broken response
        assert set(before) <= set(after)  # streamed before the failover, kept by the promoted standby
        assert set(run.answered) - set(after) == set()  # no 200 without its row on the new primary
        assert all(after[r].endswith(marker) for r, marker in run.answered.items())
        # the proxy found the new primary on its own: a request sent once the old one had stopped answered 200,
        # in time
        recovered = min((answered - promoted[0] for sent, answered, status in run.times
                         if status == 200 and sent > stopped[0]), default=None)
        assert recovered is not None and recovered < RECOVER_WITHIN_S
        # the refused requests' rows are owed, and written on the new primary
        deadline = time.monotonic() + ROWS_OWED_WITHIN_S
        while (missing := set(run.refused) - {q.split()[-1] for q in rows(new_primary_url).values()}) \
                and time.monotonic() < deadline:
            time.sleep(0.5)
        assert missing == set()
        print(f"failover, target_session_attrs={session}: {sum(run.statuses.values())} requests by {CLIENTS} "
              f"clients ({dict(run.statuses)}), "
              f"promoted {promoted[0] - stopped[0]:.1f} s after the primary stopped, first 200 needing the new "
              f"primary {max(recovered, 0):.1f} s after the promotion, {len(run.refused)} refused 503 with rows owed "
              f"and written, {len(before)} rows from before on the new primary")
    finally:
        stop(process)
