"""The durable check queue, on both backends: bounded, ordered, survives a crash, gives up on poison."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from morphguard.config import QueueSettings
from morphguard.store import open_queue
from morphguard.store.sqlite_queue import SqliteCheckQueue
from tests.servers import FLEET_KEY


@pytest.fixture(params=["sqlite", "redis"])
def make_queue(request, tmp_path):
    """A factory of queues on one backend; two calls give two consumers of the same queue."""
    stream = f"test:{uuid.uuid4().hex[:8]}"

    def make(max_size: int = 10, max_tries: int = 3, claim_idle_s: float = 300.0):
        if request.param == "sqlite":
            queue = SqliteCheckQueue(tmp_path / "q.db", max_size, max_tries)
        else:
            url = request.getfixturevalue("redis_url")
            queue = open_queue(QueueSettings(url=url, fleet_key=FLEET_KEY, stream=stream, max_tries=max_tries,
                                             claim_idle_s=claim_idle_s),
                               tmp_path / "unused.db", max_size)
        return queue  # each test closes its queues inside its own event loop

    return make


def run(coro):
    return asyncio.run(coro)


def test_entries_come_out_in_order_and_leave_only_when_done(make_queue):
    async def go():
        q = make_queue()
        await q.recover()
        for i in range(3):
            assert await q.put(f"r{i}", {"i": i, "text": "half \ud800"})
        first = await q.take(0)
        assert first is not None and first.key == "r0" and first.payload == {"i": 0, "text": "half \ud800"}
        assert (await q.take(0)).key == "r1"
        await q.done(first)
        assert await q.backlog() == 2
        await q.close()
    run(go())


def test_a_full_queue_refuses_without_storing(make_queue):
    async def go():
        q = make_queue(max_size=2)
        await q.recover()
        assert await q.put("a", {}) and await q.put("b", {})
        assert not await q.put("c", {}) and await q.backlog() == 2
        await q.close()
    run(go())


def test_an_entry_that_keeps_failing_comes_back_poisoned(make_queue):
    async def go():
        q = make_queue(max_tries=2)
        await q.recover()
        await q.put("a", {})
        for _ in range(2):
            entry = await q.take(0)
            assert entry is not None and not entry.poisoned
            await q.retry(entry)
        entry = await q.take(0)
        assert entry is not None and entry.poisoned and entry.key == "a"
        await q.dead(entry, "check_crashed")
        assert await q.backlog() == 0
        await q.close()
    run(go())


def test_take_waits_for_an_entry_put_meanwhile(make_queue):
    async def go():
        q = make_queue()
        await q.recover()

        async def later():
            await asyncio.sleep(0.2)
            await q.put("late", {})
        producer = asyncio.create_task(later())
        entry = await q.take(wait_s=3.0)
        await producer
        assert entry is not None and entry.key == "late"
        await q.close()
    run(go())


def test_claims_of_a_dead_process_are_handed_out_again_on_sqlite(tmp_path):
    async def go():
        q = SqliteCheckQueue(tmp_path / "q.db", max_size=10)
        await q.put("a", {"x": 1})
        assert await q.take(0) is not None and await q.take(0) is None  # claimed, then the process "dies"
        await q.close()
        again = SqliteCheckQueue(tmp_path / "q.db", max_size=10)
        assert await again.recover() == 1
        entry = await again.take(0)
        assert entry is not None and entry.key == "a" and not entry.poisoned
    run(go())


def test_a_dead_workers_entries_go_to_another_worker_on_redis(redis_url, tmp_path):
    async def go():
        settings = QueueSettings(url=redis_url, fleet_key=FLEET_KEY, stream=f"test:{uuid.uuid4().hex[:8]}",
                                 claim_idle_s=0.5, max_tries=3)
        dead, alive = (open_queue(settings, tmp_path / "x.db", 10) for _ in range(2))
        await dead.recover()
        await alive.recover()
        for key in ("a", "b"):
            await dead.put(key, {"k": key})
        taken = [await dead.take(0), await dead.take(0)]  # then this worker is killed: never done
        assert {e.key for e in taken if e} == {"a", "b"}
        assert await alive.take(0.1) is None  # nothing new; the claims are still fresh
        await asyncio.sleep(0.6)
        alive._next_claim = 0.0  # as if its periodic look for stale claims were due
        again = [await alive.take(0.1), await alive.take(0.1)]
        assert {e.key for e in again if e} == {"a", "b"}
        assert all(e is not None and e.tries == 1 and not e.poisoned for e in again)
        stats = await alive.stats()
        assert stats["claimed"] == 2 and stats["redeliveries"] == 2
        for entry in again:
            assert entry is not None
            await alive.done(entry)
        assert (await alive.stats())["backlog"] == 0
        await dead.close()
        await alive.close()
    run(go())


def test_poison_lands_in_the_dead_letter_stream_on_redis(redis_url, tmp_path):
    async def go():
        settings = QueueSettings(url=redis_url, fleet_key=FLEET_KEY, stream=f"test:{uuid.uuid4().hex[:8]}", max_tries=1)
        q = open_queue(settings, tmp_path / "x.db", 10)
        await q.recover()
        await q.put("p", {"poison": True})
        entry = await q.take(0)
        await q.retry(entry)
        entry = await q.take(0)
        assert entry.poisoned
        await q.dead(entry, "check_crashed")
        assert await q.stats() == {"backlog": 0, "claimed": 0, "lag": 0, "dead_letters": 1, "redeliveries": 0,
                                   "refused": 0}
        await q.close()
    run(go())


def test_an_entry_delivered_during_a_failed_read_is_taken_back_on_redis(redis_url, tmp_path):
    async def go():
        settings = QueueSettings(url=redis_url, fleet_key=FLEET_KEY, stream=f"test:{uuid.uuid4().hex[:8]}")
        q = open_queue(settings, tmp_path / "x.db", 10)
        await q.recover()
        await q.put("a", {"k": "a"})
        await q.put("b", {"k": "b"})
        working = await q.take(0)  # a task here is busy with "a"
        # The server delivers "b" to this consumer, but the reply never reaches us (a read that timed out).
        await q._redis.xreadgroup(q.group, q.consumer, {q.stream: ">"}, count=1)
        q._check_own = True
        again = await q.take(0)
        assert working.key == "a" and again is not None and again.key == "b"  # "a" is not handed out twice
        assert await q.take(0) is None
        await q.close()
    run(go())


def test_concurrent_takes_after_a_failed_read_each_get_their_own_entry_on_redis(redis_url, tmp_path):
    async def go():
        settings = QueueSettings(url=redis_url, fleet_key=FLEET_KEY, stream=f"test:{uuid.uuid4().hex[:8]}")
        q = open_queue(settings, tmp_path / "x.db", 10)
        await q.recover()
        await q.put("a", {"k": "a"})
        await q.put("b", {"k": "b"})
        # Both delivered to this consumer by a read whose reply was lost; four tasks then take at once.
        await q._redis.xreadgroup(q.group, q.consumer, {q.stream: ">"}, count=2)
        q._check_own = True
        taken = await asyncio.gather(*(q.take(0) for _ in range(4)))
        assert sorted(e.key for e in taken if e is not None) == ["a", "b"]  # each entry to one task
        await q.close()
    run(go())


def test_redis_back_without_its_data_gets_its_group_again_and_a_new_epoch(redis_url, tmp_path):
    async def go():
        settings = QueueSettings(url=redis_url, fleet_key=FLEET_KEY, stream=f"test:{uuid.uuid4().hex[:8]}")
        q = open_queue(settings, tmp_path / "x.db", 10)
        await q.recover()
        assert await q.put("before", {})
        before = q.epoch
        assert before and await q.current_epoch() == before
        await q._redis.delete(q.stream, q.stream + ":epoch")  # what a restart with no data leaves
        assert await q.current_epoch() is None
        assert await q.put("after", {})
        assert q.epoch != before
        entry = await q.take(0)  # the group is gone: made again, and reading goes on
        assert entry is not None and entry.key == "after"
        await q.done(entry)
        assert (await q.stats())["backlog"] == 0
        await q.close()
    run(go())
