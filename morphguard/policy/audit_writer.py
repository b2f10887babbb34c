"""Audit rows written by one thread in group commits, so the event loop never waits on the database.

A row is committed before the answer it records goes out (an accepted request is never left unaudited
by a crash), so its cost lies on every request's path. A thread hop per row (`asyncio.to_thread`) cost
more CPU than the insert itself; here one long-lived thread takes every row that arrived while it was
busy and commits them together, so a burst of requests shares one transaction. A batch that fails is
written again row by row: one row the database refuses fails alone. An escalated decision's outbox row
is written in the same transaction as the decision.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Sequence

from morphguard.policy.audit import AuditStore, Written
from morphguard.policy.record import DecisionRecord

log = logging.getLogger(__name__)

_Pending = tuple[DecisionRecord, "asyncio.Future[Written]"]
_STOP = None


class AuditWriter:
    def __init__(self, store: AuditStore, owner: str | None = None, max_batch: int = 256) -> None:
        self.store = store
        self.owner = owner  # who claims the escalations written here: the process that delivers them
        self.max_batch = max_batch
        self._pending: queue.SimpleQueue[_Pending | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    async def write(self, record: DecisionRecord) -> Written:
        """The row's and its escalation's ids once committed (None, None: recorded before); the database's error
        if it could not be written. A caller cancelled meanwhile does not unwrite it: the row is committed."""
        self._start()
        future: asyncio.Future[Written] = asyncio.get_running_loop().create_future()
        self._pending.put((record, future))
        return await future

    def close(self) -> None:
        """Write what is pending, then stop the thread."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._pending.put(_STOP)
            thread.join()

    def _start(self) -> None:
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    # A daemon: a process that exits without close() is not held up by an idle writer.
                    self._thread = threading.Thread(target=self._run, name="audit-writer", daemon=True)
                    self._thread.start()

    def _run(self) -> None:
        while True:
            first = self._pending.get()
            batch = [first] if first is not _STOP else []
            stopping = first is _STOP
            while not stopping and len(batch) < self.max_batch:
                try:
                    more = self._pending.get_nowait()
                except queue.Empty:
                    break
                if more is _STOP:
                    stopping = True
                else:
                    batch.append(more)
            if batch:
                self._settle(batch, self._commit([record for record, _ in batch]))
            if stopping:
                return

    def _commit(self, records: Sequence[DecisionRecord]) -> list[Written | Exception]:
        try:
            return list(self.store.record_many(records, self.owner))
        except Exception as exc:
            if len(records) == 1 or self.store.unavailable(exc):  # one by one would only fail as many times
                return [exc] * len(records)
        outcomes: list[Written | Exception] = []
        for record in records:
            try:
                outcomes.append(self.store.record_many([record], self.owner)[0])
            except Exception as exc:
                outcomes.append(exc)
        return outcomes

    @staticmethod
    def _settle(batch: list[_Pending], outcomes: list[Written | Exception]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Written], Written | Exception]]] = {}
        for (_, future), outcome in zip(batch, outcomes, strict=True):
            by_loop.setdefault(future.get_loop(), []).append((future, outcome))
        for loop, settled in by_loop.items():
            try:
                loop.call_soon_threadsafe(_resolve, settled)  # one wake-up of the loop for the whole batch
            except RuntimeError:  # that loop has closed: nobody is waiting any more, the rows are written
                log.debug("audit rows committed after their event loop closed")


def _resolve(settled: list[tuple[asyncio.Future[Written], Written | Exception]]) -> None:
    for future, outcome in settled:
        if future.cancelled():
            continue
        if isinstance(outcome, Exception):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
