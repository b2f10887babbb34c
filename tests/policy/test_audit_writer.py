"""The audit writer on a real SQLite file: group commits, a refused row failing alone, nothing lost."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest
import sqlalchemy

from morphguard.config import AuditSettings
from morphguard.policy.audit import AuditStore
from morphguard.policy.audit_writer import AuditWriter
from morphguard.policy.record import DecisionRecord


def row(n: int, model: str = "m") -> DecisionRecord:
    return DecisionRecord(request_id=f"r{n}", profile="general", topic="general", reason="no_context", model=model)


@pytest.fixture(params=["full", "normal"])
def store(tmp_path, request) -> AuditStore:
    """Each commit flushed to disk (full: every row through the writer's thread), or not (normal: rows of a quiet
    loop committed on it)."""
    store = AuditStore(AuditSettings(path=str(tmp_path / "audit.db"), synchronous=request.param))
    yield store
    store.close()


@pytest.fixture
def normal_store(tmp_path) -> AuditStore:
    store = AuditStore(AuditSettings(path=str(tmp_path / "audit.db"), synchronous="normal"))
    yield store
    store.close()


def rows(store: AuditStore) -> list[tuple[str, str]]:
    with sqlite3.connect(store.engine.url.database) as db:
        return db.execute("SELECT request_id, model FROM decisions ORDER BY id").fetchall()


def test_concurrent_rows_are_all_committed_with_their_own_ids(store):
    writer = AuditWriter(store)

    async def burst() -> list[int]:
        return await asyncio.gather(*(writer.write(row(n)) for n in range(200)))

    ids = asyncio.run(burst())
    writer.close()
    assert len(set(ids)) == 200
    assert sorted(r[0] for r in rows(store)) == sorted(f"r{n}" for n in range(200))


def test_a_row_the_database_refuses_fails_alone(store):
    with sqlite3.connect(store.engine.url.database) as db:  # a real refusal, from the database itself
        db.execute("CREATE TRIGGER refuse BEFORE INSERT ON decisions WHEN NEW.model = 'refused' "
                   "BEGIN SELECT RAISE(ABORT, 'refused by trigger'); END")
    writer = AuditWriter(store)

    async def burst() -> list[object]:
        writes = [writer.write(row(n, "refused" if n == 7 else "m")) for n in range(20)]
        return await asyncio.gather(*writes, return_exceptions=True)

    outcomes = asyncio.run(burst())
    writer.close()
    assert [n for n, o in enumerate(outcomes) if isinstance(o, Exception)] == [7]
    assert "refused by trigger" in str(outcomes[7])
    assert len(rows(store)) == 19


def test_a_cancelled_caller_still_leaves_its_row_and_close_writes_what_is_pending(store):
    writer = AuditWriter(store)

    async def leave_early() -> None:
        task = asyncio.create_task(writer.write(row(1)))
        await asyncio.sleep(0)  # the row is handed over
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(leave_early())
    writer.close()
    assert rows(store) == [("r1", "m")]


def hold_write_lock(store: AuditStore) -> sqlite3.Connection:
    """Another connection, as another process would be, holding SQLite's write lock until it commits."""
    other = sqlite3.connect(store.engine.url.database, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    return other


def test_writing_at_once_gives_way_to_a_lock_held_elsewhere(normal_store):
    store = normal_store
    other = hold_write_lock(store)
    assert store.record_at_once([row(1)]) is None  # returned at once, nothing written
    other.execute("COMMIT")
    (written,) = store.record_at_once([row(1)])
    assert written.row_id is not None
    assert store.record_at_once([row(1)]) == [(None, None)]  # one row per request id
    assert rows(store) == [("r1", "m")]


def test_a_lock_held_elsewhere_holds_up_the_row_not_the_event_loop(store):
    writer = AuditWriter(store)
    other = hold_write_lock(store)

    async def meanwhile() -> tuple[int, bool, int]:
        write = asyncio.create_task(writer.write(row(1)))
        ticks = 0
        for _ in range(30):  # the loop keeps turning while the row waits for the lock
            await asyncio.sleep(0.01)
            ticks += 1
        waiting = not write.done()
        await asyncio.to_thread(other.execute, "COMMIT")
        written = await write
        return ticks, waiting, written.row_id

    ticks, waiting, row_id = asyncio.run(meanwhile())
    writer.close()
    assert ticks == 30 and waiting and row_id is not None
    assert rows(store) == [("r1", "m")]


def test_rows_written_on_the_loop_are_checkpointed_out_of_the_log(store):
    writer = AuditWriter(store)

    async def one_at_a_time() -> None:
        for n in range(1500):
            await writer.write(row(n))

    asyncio.run(one_at_a_time())
    writer.close()
    log = Path(store.engine.url.database + "-wal")
    # Left to grow, the log would hold every page each of the 1,500 commits wrote (about 33 MB); checkpointed
    # every few hundred rows, it is reused from its start. The checkpoint runs on the writer's thread beside the
    # loop's commits, so on busy cores the log grows further past each interval before it is reused (8.5 MB seen).
    assert log.stat().st_size < 16 * 2**20
    assert len(rows(store)) == 1500


@pytest.mark.parametrize("message", ["database or disk is full", "attempt to write a readonly database",
                                     "disk I/O error"])
def test_a_disk_that_cannot_write_is_an_outage_not_a_refused_row(store, message):
    assert store.unavailable(sqlite3.OperationalError(message))
    assert not store.unavailable(sqlite3.OperationalError("no such table: decisions"))


def test_a_read_only_store_fails_as_an_outage_and_writes_again_once_writable(store):
    read_only = {"on": True}

    def pragma(connection, *_):  # SQLite's own SQLITE_READONLY on every connection the store uses
        connection.execute(f"PRAGMA query_only={int(read_only['on'])}")

    sqlalchemy.event.listen(store.engine, "checkout", pragma)
    if store.writes_at_once:
        pragma(store._at_once)
    writer = AuditWriter(store)

    async def write(n: int) -> object:
        try:
            return await writer.write(row(n))
        except Exception as exc:
            return exc

    failed = asyncio.run(write(1))
    assert isinstance(failed, sqlite3.OperationalError) and "readonly" in str(failed)
    assert store.unavailable(failed)  # waited out, not written without its texts and dropped
    read_only["on"] = False
    if store.writes_at_once:
        pragma(store._at_once)
    assert asyncio.run(write(1)).row_id is not None
    writer.close()
    assert rows(store) == [("r1", "m")]


def test_by_default_a_row_is_flushed_to_disk_before_it_counts_as_written(tmp_path):
    store = AuditStore(AuditSettings(path=str(tmp_path / "audit.db")))
    try:
        assert not store.writes_at_once  # never committed on the event loop, where a flush would stall it
        with store.engine.connect() as db:  # the connections the writer's thread commits on
            assert db.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL: the log flushed at each commit
    finally:
        store.close()
