"""Throwaway Redis and PostgreSQL servers for tests: the distribution's own binaries, started on free
loopback ports in a temporary folder and stopped by pid.

Where the binaries are missing the tests that need them skip with one line saying so, except under CI
(CI=true), where `.ci/run` installs them and a missing server is a failure.
"""

from __future__ import annotations

import glob
import os
import random
import secrets
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
    """A loopback port free now, for a server in another process to bind.

    Under pytest-xdist each worker picks from a slice of its own below the kernel's ephemeral range, so that
    neither another worker nor any process's outgoing connection (the kernel gives those ports from the
    ephemeral range) takes the port between this call and the server's bind. Elsewhere: a port the kernel
    picks. A server in this process binds `bound_socket()` instead, which holds its port from the start."""
    for port in _worker_ports():
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:  # in use, by this worker's own servers
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker_ports() -> list[int]:
    """This xdist worker's slice of the ports from 10000 up to the ephemeral range, in random order; none
    outside a worker, or where the slices would be too small."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not worker.startswith("gw") or not count.isdigit():
        return []
    try:
        ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return []
    size = (ephemeral_low - 10000) // int(count)
    if size < 200:
        return []
    start = 10000 + int(worker[2:]) % int(count) * size  # a restarted worker (gw4 of 4) reuses a slice
    ports = list(range(start, start + size))
    random.shuffle(ports)
    return ports


def bound_socket() -> socket.socket:
    """A loopback TCP socket bound to a port the kernel picked, for a server in this process to listen on
    (`uvicorn.Server.run(sockets=[...])`); its port is `getsockname()[1]`."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


def missing(message: str) -> None:
    """A test whose outside part (a server, a gateway, the shared data) is not on this machine skips, saying so;
    under CI, where `.ci/run` provides every part, it fails."""
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def _missing(what: str) -> None:
    missing(f"{what} is not installed (apt-get install -y redis-server postgresql)")


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


# The secret a test fleet's replicas and workers share (`queue.fleet_key`), fresh for each test session.
FLEET_KEY = secrets.token_hex(32)


class RedisServer:
    """A Redis that keeps what it acknowledged (append-only file), as a fleet's Redis must; on one port
    for its whole life, so that clients find it again after `stop`/`kill` and `start`."""

    def __init__(self, folder: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            _missing("redis-server")
        self.binary, self.folder, self.port = str(binary), folder, free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = self.folder / "redis.log"
        self.process = subprocess.Popen([self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir",
                                         str(self.folder), "--appendonly", "yes", "--save", "", "--daemonize", "no"],
                                        stdout=open(log, "ab"), stderr=subprocess.STDOUT)
        _wait_for_port(self.port, self.process, log)

    def stop(self) -> None:
        """A clean stop: Redis writes what it holds and comes back with it."""
        if self.process is not None:
            stop(self.process)
            self.process = None

    def kill(self, *, lose_data: bool) -> None:
        """kill -9; `lose_data`: its files go too, as if it came back on a fresh machine."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None
        if lose_data:
            for path in self.folder.iterdir():
                if path.name != "redis.log":
                    shutil.rmtree(path) if path.is_dir() else path.unlink()


@contextmanager
def redis_server(folder: Path) -> Iterator[str]:
    server = RedisServer(folder)
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


def _postgres_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found is None:
        candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
        found = candidates[-1] if candidates else None
    return found


class PostgresServer:
    """A PostgreSQL cluster in a temporary folder, trust auth on loopback, on one port for its whole life;
    `url` is that of its `postgres` database. Given a running `primary`: its streaming standby instead, a copy
    taken with `pg_basebackup -R` that follows the primary until `promote` (initdb's pg_hba already lets loopback
    replicate, and PostgreSQL's defaults stream: `wal_level=replica`, `max_wal_senders=10`)."""

    def __init__(self, primary: PostgresServer | None = None) -> None:
        initdb, postgres = _postgres_bin("initdb"), _postgres_bin("postgres")
        basebackup = _postgres_bin("pg_basebackup") if primary is not None else "unused"
        if initdb is None or postgres is None or basebackup is None:
            _missing("PostgreSQL")
        # PostgreSQL refuses to run as root: as root, run it as the distribution's postgres user, in a folder
        # that user can reach (pytest's own temporary folders are private to root).
        self.as_owner: list[str] = []
        self.folder = Path(tempfile.mkdtemp(prefix="morphguard-pg-"))
        if os.geteuid() == 0:
            self.as_owner = ["runuser", "-u", "postgres", "--"]
            self.folder.chmod(0o777)
        self.data, self.binary = self.folder / "pgdata", str(postgres)
        if primary is None:
            subprocess.run([*self.as_owner, str(initdb), "-D", str(self.data), "-U", "morphguard", "--auth=trust",
                            "-E", "UTF8"], check=True, capture_output=True)
        else:
            subprocess.run([*self.as_owner, str(basebackup), "-D", str(self.data), "-h", "127.0.0.1", "-p",
                            str(primary.port), "-U", "morphguard", "-R", "-X", "stream", "-c", "fast"],
                           check=True, capture_output=True)
        self.port = free_port()
        self.url = f"postgresql://morphguard@127.0.0.1:{self.port}/postgres"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = self.folder / "postgres.log"
        # fsync off: the tests kill our processes, never the machine; max_connections for 3 replicas + workers.
        self.process = subprocess.Popen(
            [*self.as_owner, self.binary, "-D", str(self.data), "-p", str(self.port), "-k", str(self.folder),
             "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "max_connections=200"],
            stdout=open(log, "ab"), stderr=subprocess.STDOUT)
        _wait_for_port(self.port, self.process, log)
        _wait_for_postgres(self.url, self.process, log)

    def stop(self) -> None:
        """Fast shutdown: sessions are ended, as when an operator stops the server. Through pg_ctl, which
        signals the server itself (as root, `self.process` is runuser, which does not pass SIGINT on)."""
        if self.process is not None:
            subprocess.run([*self.as_owner, str(_postgres_bin("pg_ctl")), "stop", "-D", str(self.data), "-m", "fast",
                            "-w", "-t", "20"], capture_output=True)
            stop(self.process)
            self.process = None

    def promote(self) -> None:
        """A standby becomes a primary that takes writes; returns once it does."""
        subprocess.run([*self.as_owner, str(_postgres_bin("pg_ctl")), "promote", "-D", str(self.data), "-w", "-t",
                        "20"], check=True, capture_output=True)

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


@contextmanager
def postgres_server() -> Iterator[str]:
    server = PostgresServer()
    try:
        server.start()
        yield server.url
    finally:
        server.remove()


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
