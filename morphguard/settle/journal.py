"""What a replica queued on Redis and has not yet seen recorded, kept so that a Redis that comes back
without its data does not take those checks with it.

Each entry remembers the stream's epoch it went into (`RedisCheckQueue.epoch`). While the epoch stays
the same Redis still holds the entry (or a worker has recorded it); once it differs, every entry of an
older epoch that has no audit row is lost and is queued again. Entries leave once their row is found, so
the journal holds about what this replica has waiting in the queue.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any


class Journal:
    def __init__(self) -> None:
        self._held: dict[str, tuple[str, dict[str, Any], float]] = {}  # request id → (epoch, payload, queued at)

    def __len__(self) -> int:
        return len(self._held)

    def add(self, request_id: str, payload: dict[str, Any], epoch: str) -> None:
        self._held[request_id] = (epoch, payload, time.monotonic())

    def forget(self, request_ids: Iterable[str]) -> None:
        for request_id in request_ids:
            self._held.pop(request_id, None)

    def older_than(self, seconds: float) -> list[str]:
        """Entries queued at least `seconds` ago: the ones a worker may have recorded by now."""
        moment = time.monotonic() - seconds
        return [key for key, (_, _, at) in self._held.items() if at <= moment]

    def lost(self, epoch: str | None) -> list[tuple[str, dict[str, Any]]]:
        """Entries queued into another epoch than Redis's now (None: Redis has none yet)."""
        return [(key, payload) for key, (held, payload, _) in self._held.items() if held != epoch]
