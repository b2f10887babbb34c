"""The async check queue's interface: every accepted check is written down before the client gets its answer,
and leaves the queue only once its outcome is in the audit trail.

A process killed outright (kill -9) or stopped before its queue drained leaves its entries behind;
the next start hands them out again (`recover`), so a check can run twice but is never lost. The
consumer decides what "done" means: `done` after the audit row is written, `retry` after a failure
(an entry that failed `max_tries` times is handed back once more as `poisoned`, for the caller to
record as not checked and drop with `dead`).

Two implementations: `store.sqlite_queue.SqliteCheckQueue` (one process, the default) and
`store.redis_queue.RedisCheckQueue` (Redis Streams, shared by proxy replicas and `morphguard worker`s, which is
also a `WorkerPool`); `store.open_queue` picks by `queue.url`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


class QueueUnavailable(Exception):
    """The queue cannot be reached now (Redis stopped, restarting, loading its data)."""


@dataclass(frozen=True)
class Entry:
    id: str  # the queue's own id of the entry
    key: str  # the id it was put with (the request id)
    payload: dict[str, Any]
    tries: int  # earlier deliveries that did not end in `done`
    poisoned: bool  # delivered max_tries times: record it as not checked, then `dead`
    reply_to: str | None = None  # a job a caller waits on (`WorkerPool.call`): answer it, do not audit it


class CheckQueue(Protocol):
    shared: bool  # other processes put and take here too

    async def put(self, entry_id: str, payload: dict[str, Any]) -> bool:
        """Store an entry; False when the queue is full (nothing stored)."""

    async def take(self, wait_s: float) -> Entry | None:
        """Claim the oldest unclaimed entry, waiting up to `wait_s` for one."""

    async def keep_claims(self) -> None:
        """Renew the claims of the entries this process works on (where claims expire)."""

    async def done(self, entry: Entry) -> None: ...

    async def retry(self, entry: Entry) -> None:
        """Hand the entry out again later, one try more."""

    async def dead(self, entry: Entry, reason: str) -> None:
        """Give up on a poisoned entry (the caller has audited it)."""

    async def recover(self) -> int:
        """Get ready to consume after a start; returns how many entries wait."""

    async def backlog(self) -> int:
        """Entries waiting or being checked."""

    async def stats(self) -> dict[str, int]:
        """Gauges for operators: backlog, and where the backend knows them, claimed, lag, dead letters."""

    async def reachable(self) -> bool: ...

    async def close(self) -> None: ...


class WorkerPool(Protocol):
    """Inline checks run by the workers of a fleet (`proxy.inline_via: workers`): a caller puts a job and waits
    for its reply; the worker that takes it (an entry with `reply_to`) answers."""

    async def call(self, entry_id: str, job: dict[str, Any], timeout_s: float) -> dict[str, Any] | None:
        """The worker's reply, {"error": "queue_full"}, or None when none came within `timeout_s`."""

    async def answer(self, entry: Entry, reply: dict[str, Any]) -> None:
        """Send the reply, then drop the job."""
