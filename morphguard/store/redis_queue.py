"""The shared check queue: one Redis stream, consumed by a consumer group of workers.

At-least-once. An entry read by a worker stays in the group's pending list until the worker
acknowledges it (`done`, after its audit row is written). A worker that dies leaves its entries
pending; once one has been idle for `queue.claim_idle_s`, the next worker to look claims it
(XAUTOCLAIM) and Redis counts the delivery. A read that fails on our side (a timeout while the server
had already delivered) leaves an entry in this consumer's own pending list: the next `take` claims it
back before reading new ones, one task at a time. An entry delivered `queue.max_tries` times is poison:
the worker records it as not checked and moves it to the dead-letter stream (`<stream>:dead`). A worker
renews its claims while it works on them (`keep_claims`), so only a silent worker's entries are taken over.

Redis must keep what it acknowledged: run it with `appendonly yes` (the tests do). A Redis that comes
back without its data is noticed: the consumer group is made again by whoever finds it missing, and the
stream's `epoch` (a random value kept beside the stream, set by the first put) changes, which tells the
replicas that what they queued before is gone and must be queued again (`guard.Guard`). A Redis that
cannot be reached raises `QueueUnavailable`, and so does one that does not answer: every command is bounded by
`queue.timeout_s` (or the smallest latency budget), the reads that wait on purpose by their wait and that bound.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import redis.asyncio as redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from morphguard.config import QueueSettings
from morphguard.store.queue import Entry, QueueUnavailable

log = logging.getLogger(__name__)
T = TypeVar("T")

# Bounded add in one step: no replica can push the stream past max_size between a length check and its add.
# Returns the stream's epoch ('' when full), creating it on the first put after Redis lost its data.
_PUT = """
local epoch = redis.call('GET', KEYS[2])
if not epoch then
  epoch = ARGV[5]
  redis.call('SET', KEYS[2], epoch)
end
if redis.call('XLEN', KEYS[1]) >= tonumber(ARGV[1]) then return '' end
if ARGV[6] == '' then
  redis.call('XADD', KEYS[1], '*', 'id', ARGV[2], 'payload', ARGV[3], 'tries', ARGV[4])
else
  redis.call('XADD', KEYS[1], '*', 'id', ARGV[2], 'payload', ARGV[3], 'tries', ARGV[4], 'reply_to', ARGV[6])
end
return epoch
"""


def connect(url: str, timeout_s: float, read_timeout_s: float | None = None) -> redis.Redis:
    """A client whose every command is bounded: connecting by `timeout_s`, reading by `read_timeout_s` (None:
    `timeout_s`). A pooled connection Redis dropped (a restart) is replaced and the command sent again, once; a
    command that timed out is not sent again (a Redis that does not answer is unavailable, not slow)."""
    return redis.Redis.from_url(url, decode_responses=True, health_check_interval=30, socket_keepalive=True,
                                socket_connect_timeout=timeout_s, socket_timeout=read_timeout_s or timeout_s,
                                retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 1,
                                            supported_errors=(RedisConnectionError, ConnectionError)))


@contextmanager
def _reaching() -> Iterator[None]:
    """Redis away (stopped, restarting, still loading its data) as the queue's own error."""
    try:
        yield
    except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
        raise QueueUnavailable(f"{type(exc).__name__}: {exc}") from exc


class RedisCheckQueue:
    shared = True

    def __init__(self, settings: QueueSettings, max_size: int, longest_wait_s: float = 120.0,
                 call_timeout_s: float | None = None) -> None:
        assert settings.url is not None
        self.settings, self.max_size = settings, max_size
        self.stream, self.group, self.dead_letters = settings.stream, settings.group, settings.stream + ":dead"
        self.consumer = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self._bound = call_timeout_s or settings.timeout_s
        self._redis = connect(settings.url, self._bound)
        # Reads that block server-side (a worker waiting for checks, an inline check awaited from the pool, up to
        # `longest_wait_s`) on connections of their own; each such read is bounded by its wait and `_bound`.
        self._waiting = connect(settings.url, self._bound, longest_wait_s + self._bound)
        self._in_flight: set[str] = set()  # entries handed out by this process and not yet settled
        self._check_own = False  # a read failed: entries may have been delivered to us and never seen
        self._put = self._redis.register_script(_PUT)
        self._next_claim = 0.0  # when to look for entries of dead workers again
        self.redeliveries = 0
        self.epoch = ""  # the stream's epoch the latest put went into

    @property
    def _epoch_key(self) -> str:
        return self.stream + ":epoch"

    async def put(self, entry_id: str, payload: dict[str, Any], tries: int = 0) -> bool:
        """`tries` > 0: an entry queued again (Redis lost the first copy); the worker looks for its row first."""
        return await self._add(entry_id, json.dumps(payload), tries)

    async def _add(self, entry_id: str, text: str, tries: int, reply_to: str = "") -> bool:
        with _reaching():
            epoch = await self._put(keys=[self.stream, self._epoch_key],
                                    args=[self.max_size, entry_id, text, tries, uuid.uuid4().hex, reply_to])
        if not epoch:
            return False
        self.epoch = epoch
        return True

    async def current_epoch(self) -> str | None:
        """The stream's epoch now; another than a put returned (or None) means Redis lost what it held."""
        with _reaching():
            value: Any = await self._redis.get(self._epoch_key)
        return value

    async def _grouped(self, call: Callable[[], Awaitable[T]], repeat: bool = True) -> T | None:
        """A command on the consumer group; if Redis lost the group (it came back without its data), the group
        is made again and the command repeated (None if not `repeat`)."""
        with _reaching():
            try:
                return await call()
            except ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
            log.warning("consumer group %s of %s is gone (Redis lost its data?): creating it again", self.group,
                        self.stream)
            await self._create_group()
            return await call() if repeat else None

    async def take(self, wait_s: float) -> Entry | None:
        if self._check_own:
            mine = await self._grouped(self._own_unseen)
            if mine is not None:
                return mine
            self._check_own = False
        if time.monotonic() >= self._next_claim:
            claimed = await self._grouped(self._claim_one)
            if claimed is not None:
                return claimed  # look again at once: a dead worker may have left many
            self._next_claim = time.monotonic() + min(5.0, self.settings.claim_idle_s / 4)
        async def read_new() -> Any:
            async with asyncio.timeout(wait_s + self._bound):
                return await self._waiting.xreadgroup(self.group, self.consumer, {self.stream: ">"}, count=1,
                                                      block=max(1, int(wait_s * 1000)))

        try:
            read: Any = await self._grouped(read_new)
        except QueueUnavailable:
            self._check_own = True  # the server may have delivered an entry whose reply we never read
            raise
        if not read:
            return None
        _stream, messages = read[0]
        message_id, fields = messages[0]
        return self._entry(message_id, fields, deliveries=1)

    async def _own_unseen(self) -> Entry | None:
        """An entry the group delivered to this consumer that no task here is working on.

        Concurrent takes each scan the pending list: an entry is marked as handed out before the claim is
        sent, so the others pass over it and each entry goes to one task."""
        pending: Any = await self._redis.xpending_range(self.stream, self.group, min="-", max="+", count=100,
                                                        consumername=self.consumer)
        for info in pending:
            message_id = info["message_id"]
            if message_id in self._in_flight:
                continue
            self._in_flight.add(message_id)
            try:
                claimed: Any = await self._redis.xclaim(self.stream, self.group, self.consumer, min_idle_time=0,
                                                        message_ids=[message_id])
            except BaseException:
                self._in_flight.discard(message_id)
                raise
            if claimed and claimed[0][1]:
                return self._entry(claimed[0][0], claimed[0][1], int(info["times_delivered"]) + 1)
            self._in_flight.discard(message_id)  # settled meanwhile
        return None

    async def _claim_one(self) -> Entry | None:
        claimed: Any = await self._redis.xautoclaim(
            self.stream, self.group, self.consumer, min_idle_time=int(self.settings.claim_idle_s * 1000),
            start_id="0-0", count=1)
        messages = claimed[1]
        if not messages:
            return None
        message_id, fields = messages[0]
        if message_id in self._in_flight:  # a task here still works on it: the claim only renewed it
            return None
        info = await self._redis.xpending_range(self.stream, self.group, min=message_id, max=message_id, count=1)
        deliveries = int(info[0]["times_delivered"]) if info else 2
        self.redeliveries += 1
        return self._entry(message_id, fields, deliveries)

    async def keep_claims(self) -> None:
        """Renew this process's claims on the entries it works on, so that a check slower than
        `claim_idle_s` (a store that is down, a locked table) is not taken over while its worker lives.
        JUSTID: the renewal does not count as a delivery."""
        held: list[Any] = list(self._in_flight)
        if held:
            await self._grouped(lambda: self._redis.xclaim(self.stream, self.group, self.consumer, min_idle_time=0,
                                                           message_ids=held, justid=True))

    def _entry(self, message_id: str, fields: dict[str, str], deliveries: int) -> Entry:
        self._in_flight.add(message_id)
        tries = max(int(fields.get("tries", 0)), deliveries - 1)
        return Entry(message_id, fields.get("id", ""), json.loads(fields["payload"]), tries,
                     poisoned=tries >= self.settings.max_tries, reply_to=fields.get("reply_to") or None)

    async def done(self, entry: Entry) -> None:
        await self._settle(entry)
        self._in_flight.discard(entry.id)

    async def retry(self, entry: Entry) -> None:
        """Back at the end of the stream with one try more, at once: no waiting for the claim timeout."""
        await self._settle(entry, (self.stream, {"id": entry.key, "payload": json.dumps(entry.payload),
                                                 "tries": entry.tries + 1}))
        self._in_flight.discard(entry.id)

    async def dead(self, entry: Entry, reason: str) -> None:
        await self._settle(entry, (self.dead_letters, {"id": entry.key, "payload": json.dumps(entry.payload),
                                                       "tries": entry.tries, "reason": reason}))
        self._in_flight.discard(entry.id)

    async def _settle(self, entry: Entry, then: tuple[str, dict[Any, Any]] | None = None,
                      reply: tuple[str, str] | None = None) -> None:
        """Acknowledge and delete the entry, in one transaction with what replaces it (a stream entry, a reply).
        An entry still listed as ours until this succeeds, so that its claim is renewed meanwhile."""
        async def run() -> None:
            async with self._redis.pipeline(transaction=True) as pipe:
                if then is not None:
                    pipe.xadd(then[0], then[1])
                if reply is not None:
                    pipe.rpush(reply[0], reply[1])
                    pipe.expire(reply[0], 60)
                pipe.xack(self.stream, self.group, entry.id)
                pipe.xdel(self.stream, entry.id)
                await pipe.execute()

        # Without the group the entry is no one's any more (the pipeline's other commands ran): nothing to repeat.
        await self._grouped(run, repeat=False)

    # `WorkerPool`: request/reply for inline checks run by workers (`proxy.inline_via: workers`). The job's
    # entry names a list to answer on (`reply_to`); the caller waits on it as long as its latency budget allows.

    async def call(self, entry_id: str, job: dict[str, Any], timeout_s: float) -> dict[str, Any] | None:
        """The worker's reply, {"error": "queue_full"}, or None when none came within `timeout_s`."""
        reply_to = f"{self.stream}:reply:{uuid.uuid4().hex}"
        job = {**job, "deadline": time.time() + timeout_s}
        if not await self._add(entry_id, json.dumps(job), 0, reply_to):
            return {"error": "queue_full"}
        with _reaching():
            try:
                async with asyncio.timeout(timeout_s + self._bound):
                    reply: Any = await self._waiting.blpop([reply_to], timeout=timeout_s)
            finally:
                await self._redis.delete(reply_to)
        return json.loads(reply[1]) if reply else None

    async def answer(self, entry: Entry, reply: dict[str, Any]) -> None:
        """Send the reply, then drop the job; a reply nobody waits for any more expires."""
        assert entry.reply_to is not None
        await self._settle(entry, reply=(entry.reply_to, json.dumps(reply)))
        self._in_flight.discard(entry.id)

    async def recover(self) -> int:
        """Create the group on first use; a dead worker's entries are claimed as `take` goes, and entries
        delivered to this consumer but never seen (a failed read) are taken back first."""
        with _reaching():
            await self._create_group()
        return await self.backlog()

    async def _create_group(self) -> None:
        """From the stream's start: what replicas queued before the group existed is read too."""
        try:
            await self._redis.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def backlog(self) -> int:
        with _reaching():
            return int(await self._redis.xlen(self.stream))

    async def stats(self) -> dict[str, int]:
        """backlog: entries in the stream; claimed: read, not yet done; lag: not yet read by any worker."""
        backlog = await self.backlog()
        summary: Any = await self._grouped(lambda: self._redis.xpending(self.stream, self.group))
        claimed = int(summary["pending"])
        return {"backlog": backlog, "claimed": claimed, "lag": max(0, backlog - claimed),
                "dead_letters": await self._dead_letters(), "redeliveries": self.redeliveries}

    async def _dead_letters(self) -> int:
        with _reaching():
            return int(await self._redis.xlen(self.dead_letters))

    async def reachable(self) -> bool:
        try:
            with _reaching():
                return bool(await self._redis.ping())
        except QueueUnavailable:  # also while Redis, back, still loads its data (BusyLoadingError)
            return False

    async def close(self) -> None:
        await self._redis.aclose()
        await self._waiting.aclose()
