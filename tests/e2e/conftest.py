"""Real processes on loopback: the scripted provider, and morphguard's proxy under uvicorn."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TypeVar

import httpx
import pytest
import yaml

from tests.forked import Forked, fork_command
from tests.servers import PostgresServer, free_port, stop

ROOT = Path(__file__).resolve().parents[2]
P = TypeVar("P", subprocess.Popen[bytes], Forked)


def start(cmd: list[str], ready_url: str, log: Path, timeout: float = 60,
          env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    out = open(log, "wb")
    process = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                               env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    return ready(process, ready_url, log, timeout)


def ready(process: P, ready_url: str, log: Path, timeout: float) -> P:
    """`process` once `ready_url` answers; fails with its log if it exits or does not answer in time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args} exited:\n{log.read_text()}")
        try:
            if httpx.get(ready_url, timeout=1).status_code < 500:
                return process
        except httpx.HTTPError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"{process.args} not ready:\n{log.read_text()}")


@pytest.fixture(scope="session")
def provider(tmp_path_factory) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("provider") / "provider.log"
    process = start([sys.executable, "-m", "tests.e2e.fake_provider", str(port)],
                    f"http://127.0.0.1:{port}/v1/models", log)
    yield f"http://127.0.0.1:{port}/v1"
    stop(process)


def serve(config: dict, folder: Path, port: int | None = None,
          env: dict[str, str] | None = None, processes: int = 1) -> tuple[str, Forked]:
    """`morphguard serve` with `config` written to `folder` (and `env` added), forked from the fork server
    (tests/forked.py); its base URL and process."""
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    port = port or free_port()
    args = ["serve", "--config", str(folder / "config.yaml"), "--port", str(port), "--workers", str(processes)]
    log = folder / "proxy.log"
    process = ready(fork_command(args, log, ROOT, env), f"http://127.0.0.1:{port}/healthz",
                    log, timeout=300)
    return f"http://127.0.0.1:{port}", process


@pytest.fixture(scope="session")
def proxy_factory(provider, tmp_path_factory):
    """Start `morphguard serve` with the given proxy settings; the judge is the scripted provider. The detector is
    the product's default, `auto`, which with this API judge runs `sentences`; `detector="metarag"` pins MetaRAG
    (its paper profile, or the embedded one with the local judge)."""
    started: list[subprocess.Popen[bytes]] = []

    def make(judge_model: str = "openai/judge", policy: dict | None = None, telemetry: dict | None = None,
             processes: int = 1, detector: str = "auto", detector_settings: dict | None = None,
             sections: dict | None = None, shadow: dict | None = None, **proxy: object) -> str:
        folder = tmp_path_factory.mktemp("proxy")
        upstream = {"base_url": provider, "timeout_s": 2, "max_attempts": 3, **proxy.pop("upstream", {})}
        policy = dict(policy or {})
        policy["audit"] = {"path": str(folder / "audit.db"), **policy.get("audit", {})}
        config = {
            "judge": {"model": judge_model, "api_base": provider, "api_key": "sk-judge", "max_attempts": 1},
            "detector": {"name": detector, **(detector_settings or {})},
            "metarag": {"profile": "paper" if judge_model != "local" else "embedded"},
            "proxy": {"upstream": upstream, **proxy},
            "policy": policy,
            "telemetry": telemetry or {},
            **(sections or {}),  # a detector's own section (`sentences`, ...)
            **({"shadow": shadow} if shadow else {}),
        }
        base, process = serve(config, folder, processes=processes)
        started.append(process)
        make.folders[base], make.processes[base] = folder, process
        return base

    make.folders = {}  # base URL → the proxy's folder (config, log, audit.db)
    make.processes = {}  # base URL → its `serve` process

    yield make
    for process in started:
        stop(process)


@pytest.fixture(scope="session")
def attacker():
    """A server the proxy must never reach; it records what arrives."""
    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def _record(self) -> None:
            seen.append({"path": self.path, "authorization": self.headers.get("authorization")})
            self.send_response(200)
            self.end_headers()

        do_GET = do_POST = _record

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1], seen
    server.shutdown()


@pytest.fixture
def postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL of the test's own, for tests that stop and start it."""
    server = PostgresServer()
    server.start()
    yield server
    server.remove()


def audit_row(proxy_factory, base: str, request_id: str) -> dict:
    """The audit row of one request of a `proxy_factory` proxy, waited for (a stream's row is written as it ends)."""
    deadline = time.monotonic() + 10
    while True:
        with sqlite3.connect(proxy_factory.folders[base] / "audit.db") as db:
            db.row_factory = sqlite3.Row
            row = db.execute("SELECT * FROM decisions WHERE request_id = ?", (request_id,)).fetchone()
        if row is not None or time.monotonic() > deadline:
            assert row is not None, f"no audit row for {request_id}"
            return dict(row)
        time.sleep(0.1)
