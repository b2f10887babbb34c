"""The durable check queue: bounded, ordered, survives a crash, gives up on poison."""

from __future__ import annotations

from morphguard.store.queue import SqliteCheckQueue


def test_entries_come_out_in_order_and_leave_only_when_done(tmp_path):
    q = SqliteCheckQueue(tmp_path / "q.db", max_size=10)
    for i in range(3):
        assert q.put(f"r{i}", {"i": i, "text": "half \ud800"})
    first = q.take()
    assert first is not None and first.id == "r0" and first.payload == {"i": 0, "text": "half \ud800"}
    assert q.take().id == "r1"
    q.done("r0")
    assert q.pending() == 2


def test_a_full_queue_refuses_without_storing(tmp_path):
    q = SqliteCheckQueue(tmp_path / "q.db", max_size=2)
    assert q.put("a", {}) and q.put("b", {})
    assert not q.put("c", {}) and q.pending() == 2


def test_claims_of_a_dead_process_are_handed_out_again(tmp_path):
    q = SqliteCheckQueue(tmp_path / "q.db", max_size=10)
    q.put("a", {"x": 1})
    assert q.take() is not None and q.take() is None  # claimed, then the process "dies"
    q.close()
    again = SqliteCheckQueue(tmp_path / "q.db", max_size=10)
    assert again.recover() == 1
    entry = again.take()
    assert entry is not None and entry.id == "a" and not entry.poisoned


def test_an_entry_that_keeps_failing_comes_back_poisoned(tmp_path):
    q = SqliteCheckQueue(tmp_path / "q.db", max_size=10, max_tries=2)
    q.put("a", {})
    for _ in range(2):
        entry = q.take()
        assert entry is not None and not entry.poisoned
        q.retry(entry.id)
    entry = q.take()
    assert entry is not None and entry.poisoned
