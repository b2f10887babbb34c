"""Audit rows committed before the answers they record go out, at the least cost to each request.

A row is committed before the answer it records goes out (an accepted request is never left unaudited by a
crash), so its cost lies on every request's path. Two ways to commit, both in group commits:

- On SQLite under `policy.audit.synchronous: normal` (a commit not flushed to disk), while traffic is light, the
  rows handed over during one turn of the event loop are committed together on the loop, at the start of its next
  turn (`AuditStore.record_at_once`), when SQLite's write lock is free at that moment. That costs the insert
  alone: no lock is waited for, nothing is flushed to disk, no checkpoint runs. Handing a row to a thread and back
  cost more than the insert.
- Otherwise one long-lived thread commits every row waiting at the moment in one transaction, and it is the
  thread that waits on the database, never the loop: SQLite flushing each commit to disk (`full`, the default:
  one flush for the group), PostgreSQL (a round trip over the network), a SQLite lock another connection holds,
  a row whose texts are large (hashing them would hold the loop up), a batch SQLite refused, and a busy loop (more
  than `AT_ONCE_MAX_ROWS` rows in a turn, or rows still in the thread: there the thread's commits run beside the
  loop's work, in larger groups). A batch that fails there is written again row by row: one row the database
  refuses fails alone. The thread also checkpoints SQLite's write-ahead log every `CHECKPOINT_ROWS` rows written
  on a loop.

An escalated decision's outbox row is written in the same transaction as the decision.
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
_STOP = "stop"
_CHECKPOINT = "checkpoint"
AT_ONCE_MAX_CHARS = 64 * 1024  # question, answer and context together; a larger row is written by the thread
AT_ONCE_MAX_ROWS = 4  # more rows in one turn of the loop: a busy loop, whose rows the thread commits beside it
CHECKPOINT_ROWS = 200  # about 1,000 pages of log: SQLite's own checkpoint interval


class AuditWriter:
    def __init__(self, store: AuditStore, owner: str | None = None, max_batch: int = 256) -> None:
        self.store = store
        self.owner = owner  # who claims the escalations written here: the process that delivers them
        self.max_batch = max_batch
        self._pending: queue.SimpleQueue[_Pending | str] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._gathered: dict[asyncio.AbstractEventLoop, list[_Pending]] = {}  # each loop's rows of this turn
        self._uncheckpointed = 0
        self._in_thread = 0  # rows handed to the thread and not committed yet
        self._counting = threading.Lock()

    async def write(self, record: DecisionRecord) -> Written:
        """The row's and its escalation's ids once committed (None, None: recorded before); the database's error
        if it could not be written. A caller cancelled meanwhile does not unwrite it: the row is committed."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Written] = loop.create_future()
        if self.store.writes_at_once and _chars(record) <= AT_ONCE_MAX_CHARS:
            gathered = self._gathered.setdefault(loop, [])
            if not gathered:
                loop.call_soon(self._flush, loop)
            gathered.append((record, future))
        else:
            self._hand_over([(record, future)])
        return await future

    def close(self) -> None:
        """Write what the thread holds, checkpoint, then stop the thread."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._pending.put(_STOP)
            thread.join()

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        batch = self._gathered.pop(loop, [])
        if not batch:
            return
        if len(batch) > AT_ONCE_MAX_ROWS or self._in_thread:  # busy: the thread commits beside the loop
            self._hand_over(batch)
            return
        try:
            outcomes = self.store.record_at_once([record for record, _ in batch], self.owner)
        except Exception:  # a row refused: the thread writes the batch again, row by row
            outcomes = None
        if outcomes is None:
            self._hand_over(batch)
            return
        _resolve([(future, outcome) for (_, future), outcome in zip(batch, outcomes, strict=True)])
        self._uncheckpointed += len(batch)
        if self._uncheckpointed >= CHECKPOINT_ROWS:
            self._uncheckpointed = 0
            self._start()
            self._pending.put(_CHECKPOINT)

    def _hand_over(self, batch: list[_Pending]) -> None:
        self._start()
        with self._counting:
            self._in_thread += len(batch)
        for pending in batch:
            self._pending.put(pending)

    def _start(self) -> None:
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    # A daemon: a process that exits without close() is not held up by an idle writer.
                    self._thread = threading.Thread(target=self._run, name="audit-writer", daemon=True)
                    self._thread.start()

    def _run(self) -> None:
        while True:
            batch: list[_Pending] = []
            signals: set[str] = set()
            item = self._pending.get()
            while True:
                if isinstance(item, str):
                    signals.add(item)
                else:
                    batch.append(item)
                if _STOP in signals or len(batch) >= self.max_batch:
                    break
                try:
                    item = self._pending.get_nowait()
                except queue.Empty:
                    break
            if batch:
                self._settle(batch, self._commit([record for record, _ in batch]))
                with self._counting:
                    self._in_thread -= len(batch)
            if signals:
                self._checkpoint()
            if _STOP in signals:
                return

    def _checkpoint(self) -> None:
        try:
            self.store.checkpoint()
        except Exception as exc:  # the log grows until the next one succeeds; nothing is lost
            log.warning("audit store checkpoint failed: %s", exc)

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


def _chars(record: DecisionRecord) -> int:
    return sum(len(text) for text in (record.question, record.answer, record.context) if text)


def _resolve(settled: Sequence[tuple[asyncio.Future[Written], Written | Exception]]) -> None:
    for future, outcome in settled:
        if future.cancelled():
            continue
        if isinstance(outcome, Exception):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
