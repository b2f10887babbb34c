"""The embedded check queue: one SQLite table beside the audit store, one process consuming it.

A disk that cannot be written (full, read-only, failing) is the queue being unavailable (`QueueUnavailable`), as
Redis stopped is for a fleet: the caller falls back as `proxy.on_queue_full` says.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from morphguard.store.queue import Entry, QueueUnavailable

_SCHEMA = """
CREATE TABLE IF NOT EXISTS check_queue (
    id TEXT PRIMARY KEY,
    enqueued REAL NOT NULL,
    payload TEXT NOT NULL,
    claimed REAL,
    tries INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS check_queue_order ON check_queue (claimed, enqueued);
"""


class SqliteCheckQueue:
    """The embedded queue: one SQLite table, one process consuming it."""

    shared = False

    def __init__(self, path: str | Path, max_size: int, max_tries: int = 3, synchronous: str = "full") -> None:
        self.max_size, self.max_tries = max_size, max_tries
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None, timeout=10)
        self._db.execute("PRAGMA journal_mode=WAL")
        # The audit trail's flush (`policy.audit.synchronous`): the answer of a queued check goes out once its entry is
        # committed, so under FULL a power cut loses no check whose answer went out. NORMAL keeps what a killed
        # process wrote, not what a power cut catches in the page cache; it measured 211 req/s against 176 with
        # FULL in benchmarks/proxy_overhead.py at concurrency 16 (two runs).
        self._db.execute(f"PRAGMA synchronous={'FULL' if synchronous == 'full' else 'NORMAL'}")
        self._db.executescript(_SCHEMA)
        self._added = asyncio.Event()  # the only producer is this process: no polling while idle

    async def put(self, entry_id: str, payload: dict[str, Any]) -> bool:
        stored = await asyncio.to_thread(self._put, entry_id, json.dumps(payload))  # ASCII escapes: lone
        if stored:                                                                  # surrogates survive
            self._added.set()
        return stored

    def _put(self, entry_id: str, text: str) -> bool:
        with self._locked():
            self._db.execute("BEGIN IMMEDIATE")
            try:
                (size,) = self._db.execute("SELECT count(*) FROM check_queue").fetchone()
                if size < self.max_size:
                    self._db.execute("INSERT INTO check_queue (id, enqueued, payload) VALUES (?, ?, ?)",
                                     (entry_id, time.time(), text))
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
        return size < self.max_size

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """The connection, to this thread alone; the database's errors as the queue's being unavailable."""
        with self._lock:
            try:
                yield
            except sqlite3.OperationalError as exc:
                raise QueueUnavailable(f"the queue's SQLite file cannot be used: {exc}") from exc

    async def take(self, wait_s: float) -> Entry | None:
        entry = await asyncio.to_thread(self._take)
        if entry is None and wait_s > 0:
            self._added.clear()
            try:
                await asyncio.wait_for(self._added.wait(), timeout=wait_s)
            except TimeoutError:
                return None
            entry = await asyncio.to_thread(self._take)
        return entry

    def _take(self) -> Entry | None:
        with self._locked():
            row = self._db.execute(
                "UPDATE check_queue SET claimed = ? WHERE id = (SELECT id FROM check_queue WHERE claimed IS NULL "
                "ORDER BY enqueued LIMIT 1) RETURNING id, payload, tries", (time.time(),)).fetchone()
        if row is None:
            return None
        entry_id, payload, tries = row
        return Entry(entry_id, entry_id, json.loads(payload), tries, poisoned=tries >= self.max_tries)

    async def keep_claims(self) -> None:
        return None  # claims last until the next start

    async def done(self, entry: Entry) -> None:
        await asyncio.to_thread(self._run, "DELETE FROM check_queue WHERE id = ?", entry.id)

    async def retry(self, entry: Entry) -> None:
        await asyncio.to_thread(self._run, "UPDATE check_queue SET claimed = NULL, tries = tries + 1 WHERE id = ?",
                                entry.id)
        self._added.set()

    async def dead(self, entry: Entry, reason: str) -> None:
        await self.done(entry)  # the audit row (check_crashed) is its record; one process has no one to tell

    async def recover(self) -> int:
        """Release the claims of a previous run: this process is the queue's only consumer."""
        await asyncio.to_thread(self._run, "UPDATE check_queue SET claimed = NULL WHERE claimed IS NOT NULL")
        return await self.backlog()

    async def backlog(self) -> int:
        return int(await asyncio.to_thread(self._count))

    async def stats(self) -> dict[str, int]:
        return {"backlog": await self.backlog()}

    async def reachable(self) -> bool:
        return True  # a file beside the process

    def _count(self) -> int:
        with self._locked():
            return int(self._db.execute("SELECT count(*) FROM check_queue").fetchone()[0])

    def _run(self, sql: str, *args: Any) -> None:
        with self._locked():
            self._db.execute(sql, args)

    async def close(self) -> None:
        with self._lock:
            self._db.close()
