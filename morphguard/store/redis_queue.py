"""The shared check queue: one Redis stream, consumed by a consumer group of workers.

At-least-once. An entry read by a worker stays in the group's pending list until the worker
acknowledges it (`done`, after its audit row is written). A worker that dies leaves its entries
pending; once one has been idle for `queue.claim_idle_s`, the next worker to look claims it
(XAUTOCLAIM) and Redis counts the delivery. A read that fails on our side (a timeout while the server
had already delivered) leaves an entry in this consumer's own pending list: the next `take` claims it
back before reading new ones. An entry delivered `queue.max_tries` times is poison: the
worker records it as not checked and moves it to the dead-letter stream (`<stream>:dead`).

Redis must keep what it acknowledged: run it with `appendonly yes` (the tests do).
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from typing import Any

import redis.asyncio as redis
from redis.exceptions import RedisError, ResponseError

from morphguard.config import QueueSettings
from morphguard.store.queue import Entry

# Bounded add in one step: no replica can push the stream past max_size between a length check and its add.
_PUT = """
if redis.call('XLEN', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
redis.call('XADD', KEYS[1], '*', 'id', ARGV[2], 'payload', ARGV[3], 'tries', ARGV[4])
return 1
"""


class RedisCheckQueue:
    shared = True

    def __init__(self, settings: QueueSettings, max_size: int, longest_wait_s: float = 120.0) -> None:
        assert settings.url is not None
        self.settings, self.max_size = settings, max_size
        self.stream, self.group, self.dead_letters = settings.stream, settings.group, settings.stream + ":dead"
        self.consumer = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        # Reads may block server-side for up to `longest_wait_s` (an inline check awaited from the pool): the
        # socket must wait longer than that, or a busy machine turns a slow answer into a lost read.
        self._redis = redis.Redis.from_url(settings.url, decode_responses=True, health_check_interval=30,
                                           socket_timeout=longest_wait_s + 30, socket_keepalive=True)
        self._in_flight: set[str] = set()  # entries handed out by this process and not yet settled
        self._check_own = False  # a read failed: entries may have been delivered to us and never seen
        self._put = self._redis.register_script(_PUT)
        self._next_claim = 0.0  # when to look for entries of dead workers again
        self.redeliveries = 0

    async def put(self, entry_id: str, payload: dict[str, Any]) -> bool:
        return await self._add(entry_id, json.dumps(payload), 0)

    async def _add(self, entry_id: str, text: str, tries: int) -> bool:
        return bool(await self._put(keys=[self.stream], args=[self.max_size, entry_id, text, tries]))

    async def take(self, wait_s: float) -> Entry | None:
        if self._check_own:
            mine = await self._own_unseen()
            if mine is not None:
                return mine
            self._check_own = False
        if time.monotonic() >= self._next_claim:
            claimed = await self._claim_one()
            if claimed is not None:
                return claimed  # look again at once: a dead worker may have left many
            self._next_claim = time.monotonic() + min(5.0, self.settings.claim_idle_s / 4)
        try:
            read: Any = await self._redis.xreadgroup(self.group, self.consumer, {self.stream: ">"}, count=1,
                                                block=max(1, int(wait_s * 1000)))
        except (RedisError, OSError):
            self._check_own = True  # the server may have delivered an entry whose reply we never read
            raise
        if not read:
            return None
        _stream, messages = read[0]
        message_id, fields = messages[0]
        return self._entry(message_id, fields, deliveries=1)

    async def _own_unseen(self) -> Entry | None:
        """An entry the group delivered to this consumer that no task here is working on."""
        pending: Any = await self._redis.xpending_range(self.stream, self.group, min="-", max="+", count=100,
                                                        consumername=self.consumer)
        for info in pending:
            message_id = info["message_id"]
            if message_id in self._in_flight:
                continue
            claimed: Any = await self._redis.xclaim(self.stream, self.group, self.consumer, min_idle_time=0,
                                                    message_ids=[message_id])
            if claimed and claimed[0][1]:
                return self._entry(claimed[0][0], claimed[0][1], int(info["times_delivered"]) + 1)
        return None

    async def _claim_one(self) -> Entry | None:
        claimed: Any = await self._redis.xautoclaim(
            self.stream, self.group, self.consumer, min_idle_time=int(self.settings.claim_idle_s * 1000),
            start_id="0-0", count=1)
        messages = claimed[1]
        if not messages:
            return None
        message_id, fields = messages[0]
        info = await self._redis.xpending_range(self.stream, self.group, min=message_id, max=message_id, count=1)
        deliveries = int(info[0]["times_delivered"]) if info else 2
        self.redeliveries += 1
        return self._entry(message_id, fields, deliveries)

    def _entry(self, message_id: str, fields: dict[str, str], deliveries: int) -> Entry:
        self._in_flight.add(message_id)
        tries = max(int(fields.get("tries", 0)), deliveries - 1)
        return Entry(message_id, fields.get("id", ""), json.loads(fields["payload"]), tries,
                     poisoned=tries >= self.settings.max_tries)

    async def done(self, entry: Entry) -> None:
        self._in_flight.discard(entry.id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.xack(self.stream, self.group, entry.id)
            pipe.xdel(self.stream, entry.id)
            await pipe.execute()

    async def retry(self, entry: Entry) -> None:
        """Back at the end of the stream with one try more, at once: no waiting for the claim timeout."""
        self._in_flight.discard(entry.id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.xadd(self.stream, {"id": entry.key, "payload": json.dumps(entry.payload), "tries": entry.tries + 1})
            pipe.xack(self.stream, self.group, entry.id)
            pipe.xdel(self.stream, entry.id)
            await pipe.execute()

    async def dead(self, entry: Entry, reason: str) -> None:
        self._in_flight.discard(entry.id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.xadd(self.dead_letters, {"id": entry.key, "payload": json.dumps(entry.payload), "tries": entry.tries,
                                          "reason": reason})
            pipe.xack(self.stream, self.group, entry.id)
            pipe.xdel(self.stream, entry.id)
            await pipe.execute()

    # Request/reply for inline checks run by workers (`proxy.inline_via: workers`): the job names a list
    # to answer on; the caller waits on it as long as its latency budget allows.

    async def call(self, entry_id: str, payload: dict[str, Any], timeout_s: float) -> dict[str, Any] | None:
        """The worker's reply, {"error": "queue_full"}, or None when none came within `timeout_s`."""
        reply_to = f"{self.stream}:reply:{uuid.uuid4().hex}"
        job = {**payload, "reply_to": reply_to, "deadline": time.time() + timeout_s}
        if not await self._add(entry_id, json.dumps(job), 0):
            return {"error": "queue_full"}
        try:
            reply: Any = await self._redis.blpop([reply_to], timeout=timeout_s)
        finally:
            await self._redis.delete(reply_to)
        return json.loads(reply[1]) if reply else None

    async def answer(self, entry: Entry, reply: dict[str, Any]) -> None:
        """Send the reply, then drop the job; a reply nobody waits for any more expires."""
        self._in_flight.discard(entry.id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.rpush(entry.payload["reply_to"], json.dumps(reply))
            pipe.expire(entry.payload["reply_to"], 60)
            pipe.xack(self.stream, self.group, entry.id)
            pipe.xdel(self.stream, entry.id)
            await pipe.execute()

    async def recover(self) -> int:
        """Create the group on first use; a dead worker's entries are claimed as `take` goes, and entries
        delivered to this consumer but never seen (a failed read) are taken back first."""
        try:
            await self._redis.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        return await self.backlog()

    async def backlog(self) -> int:
        return int(await self._redis.xlen(self.stream))

    async def stats(self) -> dict[str, int]:
        """backlog: entries in the stream; claimed: read, not yet done; lag: not yet read by any worker."""
        backlog = await self.backlog()
        summary = await self._redis.xpending(self.stream, self.group)
        claimed = int(summary["pending"])
        return {"backlog": backlog, "claimed": claimed, "lag": max(0, backlog - claimed),
                "dead_letters": int(await self._redis.xlen(self.dead_letters)), "redeliveries": self.redeliveries}

    async def reachable(self) -> bool:
        try:
            return bool(await self._redis.ping())
        except (RedisError, OSError):
            return False

    async def close(self) -> None:
        await self._redis.aclose()
