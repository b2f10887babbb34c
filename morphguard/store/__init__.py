"""Durable state shared by the parts of a deployment, each behind one small interface.

- `database`: the SQL engine behind the audit trail and escalation outbox (SQLite or PostgreSQL by URL,
  schema migrations with Alembic); the tables themselves belong to `policy.audit`.
- `queue`: the async check queue's interface (`CheckQueue`, and `WorkerPool` for inline checks a fleet's workers
  run); `sqlite_queue` for one process, `redis_queue` (Redis Streams) for a fleet, chosen by `open_queue`.
- `detections`: the detection cache a fleet shares (Redis, with a TTL).
"""

from __future__ import annotations

from pathlib import Path

from morphguard.config import QueueSettings
from morphguard.store.queue import CheckQueue
from morphguard.store.sqlite_queue import SqliteCheckQueue


def open_queue(settings: QueueSettings, sqlite_path: str | Path, max_size: int,
               longest_wait_s: float = 120.0, call_timeout_s: float | None = None,
               synchronous: str = "full") -> CheckQueue:
    """`longest_wait_s`: the longest this process waits on the queue in one call (an awaited inline check);
    `call_timeout_s`: the longest any other call may take (None: `settings.timeout_s`); `synchronous`: the
    embedded queue's flush of each commit (the audit trail's)."""
    if settings.url is None:
        return SqliteCheckQueue(sqlite_path, max_size, settings.max_tries, synchronous)
    from morphguard.store.redis_queue import RedisCheckQueue  # redis is needed only by fleets

    return RedisCheckQueue(settings, max_size, longest_wait_s, call_timeout_s)
