"""Redis gone silent for one replica: a TCP relay in front of a real Redis turns into a black hole (it accepts
connections and answers nothing, as a dead route or a frozen host does), while requests flow through the proxy in
async mode, then lets traffic through again.

No client waits on the silent Redis past `queue.timeout_s` and the fallback: every request is answered, none with a
5xx, none near its own timeout; the outage is logged and /readyz answers 503 (rather than hanging) within seconds,
and 200 again once Redis answers; every answered request has its row in the end."""

from __future__ import annotations

import re
import socket
import sqlite3
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import serve, stop
from tests.e2e.test_proxy import PASSAGE, QUESTION

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

CLIENTS = 4
STALL_AT_S = 3.0
STALL_FOR_S = 8.0
AFTER_S = 4.0
CLIENT_TIMEOUT_S = 15.0  # the clients gave up at 30 s; a bounded proxy answers well within this


class BlackHole:
    """A relay to `port` on loopback; `stall()` makes it swallow everything and answer nothing, `resume()` lets
    traffic through again (connections accepted meanwhile stay silent: their clients give up on them)."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.stalled = threading.Event()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def stall(self) -> None:
        self.stalled.set()

    def resume(self) -> None:
        self.stalled.clear()

    def _accept(self) -> None:
        while True:
            client, _ = self._server.accept()
            if self.stalled.is_set():
                self._held.append(client)  # accepted, never answered
                continue
            upstream = socket.create_connection(("127.0.0.1", self.target))
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                if not self.stalled.is_set():  # stalled: swallowed
                    sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def config(provider: str, redis_url: str, folder: Path) -> dict:
    return {
        "judge": {"model": "openai/judge", "api_base": provider, "api_key": "sk-judge", "max_attempts": 1},
        "detector": {"name": "direct"},
        "proxy": {"upstream": {"base_url": provider, "timeout_s": 10}, "mode": "async", "workers": 2,
                  "shutdown_grace_s": 2},
        "queue": {"url": redis_url, "stream": f"checks:{time.monotonic_ns()}", "timeout_s": 1.0},
        "policy": {"profiles": {"general": {"action": "annotate", "escalate": False, "threshold": 0.5,
                                            "topics": {}}},
                   "audit": {"path": str(folder / "audit.db")}},
    }


def test_a_silent_redis_holds_no_client_and_is_reported_within_seconds(provider, redis_url, tmp_path):
    port = int(re.search(r":(\d+)/", redis_url).group(1))
    hole = BlackHole(port)
    base, process = serve(config(provider, f"redis://127.0.0.1:{hole.port}/0", tmp_path), tmp_path)
    statuses: Counter[int] = Counter()
    answered: list[str] = []
    slowest = [0.0]
    ready: list[tuple[float, int]] = []
    lock = threading.Lock()
    started = time.monotonic()
    stop_at = started + STALL_AT_S + STALL_FOR_S + AFTER_S

    def client() -> None:
        with httpx.Client(timeout=CLIENT_TIMEOUT_S) as http:
            while time.monotonic() < stop_at:
                body = {"model": "faithful", "messages": [{"role": "user", "content": QUESTION}],
                        "morphguard": {"context": PASSAGE}}
                began = time.monotonic()
                try:
                    response = http.post(base + "/v1/chat/completions", json=body)
                    status = response.status_code
                except httpx.HTTPError:  # its own timeout, or a broken response
                    status = 0
                with lock:
                    statuses[status] += 1
                    slowest[0] = max(slowest[0], time.monotonic() - began)
                    if status == 200:
                        answered.append(response.json()["morphguard"]["request_id"])
                time.sleep(0.1)

    def probe() -> None:
        while time.monotonic() < stop_at + 10:
            try:
                status = httpx.get(base + "/readyz", timeout=CLIENT_TIMEOUT_S).status_code
            except httpx.TimeoutException:
                status = 0
            ready.append((time.monotonic() - started, status))
            time.sleep(0.25)

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)] + [threading.Thread(target=probe)]
    try:
        for thread in threads:
            thread.start()
        time.sleep(STALL_AT_S)
        hole.stall()
        time.sleep(STALL_FOR_S)
        hole.resume()
        for thread in threads:
            thread.join()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(recorded(tmp_path, answered)) < len(answered):
            time.sleep(0.5)
    finally:
        stop(process)
    log = (tmp_path / "proxy.log").read_text()
    not_ready = [t for t, status in ready if status == 503]
    back = min((t for t, status in ready if status == 200 and t >= STALL_AT_S + STALL_FOR_S), default=-1.0)
    print(f"black hole: sent {sum(statuses.values())}, statuses {dict(statuses)}, slowest {slowest[0]:.1f} s, "
          f"first 503 on /readyz {min(not_ready, default=-1) - STALL_AT_S:.1f} s into the stall, 200 again "
          f"{back - STALL_AT_S - STALL_FOR_S:.1f} s after it, rows "
          f"{len(recorded(tmp_path, answered))}/{len(answered)}")
    assert set(statuses) == {200}  # no 5xx, and no client left to its own timeout
    assert 0 not in [status for _, status in ready]  # /readyz answered throughout
    assert not_ready and min(not_ready) < STALL_AT_S + STALL_FOR_S  # not ready during the stall, said in time
    assert ready[-1][1] == 200  # and ready again once Redis answers
    assert "async check queue unavailable" in log
    assert len(recorded(tmp_path, answered)) == len(answered)


def recorded(folder: Path, request_ids: list[str]) -> set[str]:
    with sqlite3.connect(folder / "audit.db") as db:
        return {r for (r,) in db.execute("SELECT request_id FROM decisions")} & set(request_ids)
