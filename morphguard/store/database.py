"""One SQL database behind every backend: SQLite for one process, PostgreSQL for a fleet.

SQLAlchemy Core gives the two one schema definition and one dialect of queries; Alembic keeps the schema
up to date (`migrate`). Callers name a database by URL; `connect` applies what each engine needs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config as AlembicConfig


def url_for(url: str | None, sqlite_path: str | Path) -> str:
    """The configured URL, or the embedded SQLite file; `postgresql://` is served by psycopg 3."""
    if url is None:
        return f"sqlite:///{Path(sqlite_path)}"
    if url.startswith(("postgresql://", "postgres://")):
        return "postgresql+psycopg://" + _hosts_as_parameters(url.split("://", 1)[1])
    return url


def _hosts_as_parameters(rest: str) -> str:
    """libpq's several hosts (`user@db1:5432,db2:5432/name?...`) as the `host=` parameters SQLAlchemy reads: it
    parses one host and port only. One host is left as it is."""
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    authority, tail = rest[:cut], rest[cut:]
    userinfo, at, hosts = authority.rpartition("@")
    if "," not in hosts:
        return rest
    path, _, query = tail.partition("?")
    parameters = "&".join(f"host={host}" for host in hosts.split(","))
    return f"{userinfo}{at}{path or '/'}?{parameters}{'&' + query if query else ''}"


def connect(url: str, pool_size: int = 5, synchronous: str = "full") -> sa.Engine:
    """`synchronous`: SQLite's flush of each commit, `full` or `normal` (see `_sqlite_pragmas`)."""
    if url.startswith("sqlite"):
        path = sa.make_url(url).database
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        # LIFO: the audit writer gets back the connection it just used. Handed the least recent one instead, it
        # found its page cache stale (another connection had written) and read ~15 pages again for each row.
        engine = sa.create_engine(url, connect_args={"timeout": 10, "check_same_thread": False}, pool_use_lifo=True)
        sa.event.listen(engine, "connect", lambda connection, _: _sqlite_pragmas(connection, synchronous))
        return engine
    # pre_ping: a connection the server dropped (a restart, an idle timeout) is replaced, not handed out.
    return sa.create_engine(url, pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True)


def _sqlite_pragmas(connection: Any, synchronous: str) -> None:
    cursor = connection.cursor()
    # WAL: readers (`morphguard audit`) never block the proxy's writes. synchronous=FULL: each commit is flushed to
    # disk (fsync of the log) before it returns, so a committed row survives a power cut or a kernel crash of the
    # host. NORMAL appends to the log without flushing it (the log is flushed at checkpoints): a committed row
    # survives the process being killed (the OS holds what was written), and a power cut can undo the rows committed
    # since the last checkpoint, never corrupt the file.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA synchronous={'FULL' if synchronous == 'full' else 'NORMAL'}")
    cursor.close()


def migrate(engine: sa.Engine, script_location: str) -> None:
    """Bring the schema to the newest revision; several processes starting at once take turns."""
    settings = AlembicConfig()
    settings.set_main_option("script_location", script_location)
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            # Replicas starting together would race to create the same tables; the lock ends with the transaction.
            connection.execute(sa.text("SELECT pg_advisory_xact_lock(727274)"))
        settings.attributes["connection"] = connection
        command.upgrade(settings, "head")


def reachable(engine: sa.Engine) -> bool:
    try:
        with engine.connect() as connection:
            connection.execute(sa.text("SELECT 1"))
        return True
    except sa.exc.SQLAlchemyError:
        return False
