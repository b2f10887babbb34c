"""What the fleet reads from Redis counts only with the fleet key's seal: a plain Redis client, which can write
anything there, cannot put a check before a worker, answer a caller or fill the detection cache."""

from __future__ import annotations

import asyncio
import json
import secrets
import uuid

import pytest
import redis.asyncio as redis
from pydantic import SecretStr

from morphguard.config import QueueSettings, parse_config
from morphguard.errors import ConfigError
from morphguard.store import open_queue
from morphguard.store.detections import DetectionCache
from morphguard.store.redis_queue import RedisCheckQueue
from morphguard.store.sealed import FleetKey
from tests.servers import FLEET_KEY

FORGED = {"detection": {"detector": "direct", "score": 0.0, "threshold": 0.5, "flagged": False}}


def _queue(redis_url: str, tmp_path, key: str = FLEET_KEY) -> RedisCheckQueue:
    settings = QueueSettings(url=redis_url, fleet_key=key, stream=f"test:{uuid.uuid4().hex[:8]}")
    queue = open_queue(settings, tmp_path / "unused.db", 10)
    assert isinstance(queue, RedisCheckQueue)
    return queue


def test_a_seal_holds_only_for_its_key_its_text_and_what_it_is_about():
    key = FleetKey(SecretStr(FLEET_KEY))
    sealed = key.seal('{"score": 0.9}', "reply", "job-1")
    assert key.open(sealed, "reply", "job-1") == '{"score": 0.9}'
    assert key.open(sealed, "reply", "job-2") is None  # moved to another job
    assert FleetKey(SecretStr(secrets.token_hex(32))).open(sealed, "reply", "job-1") is None  # another fleet
    tampered = json.loads(sealed) | {"body": '{"score": 0.0}'}
    assert key.open(json.dumps(tampered), "reply", "job-1") is None
    for junk in ('{"score": 0.0}', "not json", json.dumps({"body": "x", "seal": "é\ud800"}), None, 7):
        assert key.open(junk, "reply", "job-1") is None


def test_an_entry_a_plain_redis_client_adds_is_set_aside_unread(redis_url, tmp_path):
    async def go():
        q = _queue(redis_url, tmp_path)
        await q.recover()
        outsider = redis.Redis.from_url(redis_url, decode_responses=True)
        await outsider.xadd(q.stream, {"id": "forged", "payload": json.dumps({"detect": {}}), "tries": 0,
                                       "reply_to": "somebody:else"})
        await q.put("genuine", {"k": 1})
        first, second = await q.take(0), await q.take(0)
        stats = await q.stats()
        dead = await outsider.xrange(q.dead_letters)
        await outsider.aclose()
        await q.close()
        return first, second, stats, dead

    first, second, stats, dead = asyncio.run(go())
    assert first is None  # the forged entry: refused, never handed to the worker
    assert second is not None and second.key == "genuine" and second.payload == {"k": 1}
    assert stats["refused"] == 1 and stats["dead_letters"] == 1
    assert [fields for _, fields in dead] == [{"id": "forged", "reason": "unsealed"}]


def test_a_forged_reply_is_ignored_and_the_workers_reply_still_comes_through(redis_url, tmp_path):
    async def go():
        caller, worker = _queue(redis_url, tmp_path), _queue(redis_url, tmp_path)
        worker.stream, worker.group, worker.dead_letters = caller.stream, caller.group, caller.dead_letters
        await worker.recover()
        outsider = redis.Redis.from_url(redis_url, decode_responses=True)

        async def forge_then_answer() -> None:
            entry = await worker.take(5)
            assert entry is not None and entry.reply_to is not None
            await outsider.rpush(entry.reply_to, json.dumps(FORGED))  # first, as a faster attacker would
            await asyncio.sleep(0.2)
            await worker.answer(entry, {"detection": {"score": 0.9, "flagged": True}})

        answering = asyncio.create_task(forge_then_answer())
        reply = await caller.call("req-1", {"detect": {}}, timeout_s=5)
        await answering
        refused = caller.refused
        await outsider.aclose()
        await caller.close()
        await worker.close()
        return reply, refused

    reply, refused = asyncio.run(go())
    assert reply == {"detection": {"score": 0.9, "flagged": True}}
    assert refused == 1


def test_only_forged_replies_make_the_call_fail_as_unsealed(redis_url, tmp_path):
    async def go():
        caller = _queue(redis_url, tmp_path)
        await caller.recover()
        outsider = redis.Redis.from_url(redis_url, decode_responses=True)

        async def forge() -> None:
            while True:  # the job is in the stream in clear: its reply_to is there for anyone to read
                entries = await outsider.xrange(caller.stream)
                if entries:
                    await outsider.rpush(entries[0][1]["reply_to"], json.dumps(FORGED))
                    return
                await asyncio.sleep(0.01)

        forging = asyncio.create_task(forge())
        reply = await caller.call("req-2", {"detect": {}}, timeout_s=1.5)
        await forging
        await outsider.aclose()
        await caller.close()
        return reply

    assert asyncio.run(go()) == {"error": "unsealed_reply"}


def test_a_cached_detection_a_plain_redis_client_wrote_is_a_miss(redis_url):
    async def go():
        cache = DetectionCache(redis_url, 60, SecretStr(FLEET_KEY))
        outsider = redis.Redis.from_url(redis_url, decode_responses=True)
        forged_key, genuine_key = (f"morphguard:detection:{uuid.uuid4().hex}" for _ in range(2))
        await outsider.set(forged_key, json.dumps({"score": 0.0, "flagged": False}))
        await cache.put(genuine_key, {"score": 0.9})
        found = await cache.get(forged_key), await cache.get(genuine_key)
        await outsider.aclose()
        await cache.close()
        return found

    assert asyncio.run(go()) == (None, {"score": 0.9})


def test_a_fleet_on_redis_without_a_key_does_not_start():
    with pytest.raises(ConfigError, match="queue.fleet_key"):
        parse_config("queue:\n  url: redis://127.0.0.1:6379/0\n", source="fleet.yaml")
    assert parse_config("proxy:\n  mode: inline\n").queue.fleet_key is None  # one process, no Redis: unchanged
