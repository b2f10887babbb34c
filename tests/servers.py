"""Throwaway Redis and PostgreSQL servers for tests: the distribution's own binaries, started on free
loopback ports in a temporary folder and stopped by pid.

Where the binaries are missing the tests that need them skip with one line saying so, except under CI
(CI=true), where `.ci/run` installs them and a missing server is a failure.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _missing(what: str) -> None:
    message = f"{what} is not installed (apt-get install -y redis-server postgresql)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def _wait_for_port(port: int, process: subprocess.Popen[bytes], log: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited:\n{log.read_text()}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"server not listening on {port}:\n{log.read_text()}")


def stop(process: subprocess.Popen[bytes]) -> None:
    """Terminate, and kill what does not stop within 20 s."""
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextmanager
def redis_server(folder: Path) -> Iterator[str]:
    """A Redis that keeps what it acknowledged (append-only file), as a fleet's Redis must."""
    binary = shutil.which("redis-server")
    if binary is None:
        _missing("redis-server")
    port = free_port()
    log = folder / "redis.log"
    process = subprocess.Popen([str(binary), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder),
                                "--appendonly", "yes", "--save", "", "--daemonize", "no"],
                               stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    try:
        _wait_for_port(port, process, log)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        stop(process)


def _postgres_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found is None:
        candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
        found = candidates[-1] if candidates else None
    return found


@contextmanager
def postgres_server() -> Iterator[str]:
    """A PostgreSQL cluster in a temporary folder, trust auth on loopback; yields the URL of its
    `postgres` database."""
    initdb, postgres = _postgres_bin("initdb"), _postgres_bin("postgres")
    if initdb is None or postgres is None:
        _missing("PostgreSQL")
    # PostgreSQL refuses to run as root: as root, run it as the distribution's postgres user, in a folder
    # that user can reach (pytest's own temporary folders are private to root).
    as_owner: list[str] = []
    folder = Path(tempfile.mkdtemp(prefix="morphguard-pg-"))
    if os.geteuid() == 0:
        as_owner = ["runuser", "-u", "postgres", "--"]
        folder.chmod(0o777)
    data = folder / "pgdata"
    subprocess.run([*as_owner, str(initdb), "-D", str(data), "-U", "morphguard", "--auth=trust", "-E", "UTF8"],
                   check=True, capture_output=True)
    port = free_port()
    log = folder / "postgres.log"
    # fsync off: the tests kill our processes, never the machine; max_connections for 3 replicas + workers.
    process = subprocess.Popen([*as_owner, str(postgres), "-D", str(data), "-p", str(port), "-k", str(folder),
                                "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "max_connections=200"],
                               stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    url = f"postgresql://morphguard@127.0.0.1:{port}/postgres"
    try:
        _wait_for_port(port, process, log)
        _wait_for_postgres(url, process, log)
        yield url
    finally:
        stop(process)
        shutil.rmtree(folder, ignore_errors=True)


def _wait_for_postgres(url: str, process: subprocess.Popen[bytes], log: Path, timeout: float = 30) -> None:
    """Until the server takes a session: it listens before it has finished starting up, and refuses sessions then
    ("the database system is starting up")."""
    import psycopg

    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"server exited:\n{log.read_text()}")
        try:
            psycopg.connect(url, connect_timeout=5).close()
            return
        except psycopg.OperationalError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.1)


def fresh_database(server_url: str, name: str) -> str:
    """An empty database on the server; its URL."""
    import psycopg

    with psycopg.connect(server_url, autocommit=True) as db:
        db.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        db.execute(f'CREATE DATABASE "{name}"')
    return server_url.rsplit("/", 1)[0] + "/" + name
