"""Fair shares of what checks wait for: the judge's places (`judge.concurrency`) and the threads that read text.

A check runs on behalf of a client (`on_behalf_of`: the checker opens it around the check, with a digest of who is
asking, `client_id`: the request path names the client by the identity the proxy authenticated, else by where the
request came from, never by a key it merely presents), and every judge call and text-reading thread of the check waits
for its place in a `FairLimit` under that client's name. While places are taken, a freed one goes to the waiting client
served longest ago (round robin), each client's own waiters first come first served: a client sending many large checks
at once waits behind its own work, not in front of everyone else's. The threads that read text (`in_thread`) are also
shared in turn, in two lanes: work on long texts in one thread, work on short ones in a few beside it, one per client,
so that one client's large checks neither take every thread nor slow the event loop by their number.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import hashlib
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from typing import TypeVar

_CLIENT: ContextVar[str] = ContextVar("morphguard_client", default="")

T = TypeVar("T")


def client_id(who: str | None) -> str:
    """A client's name in the fair shares: a digest of what names it (never a key itself), "" without one."""
    return hashlib.sha256(who.encode("utf-8", "surrogateescape")).hexdigest()[:16] if who else ""


@contextmanager
def on_behalf_of(client: str) -> Iterator[None]:
    """The judge calls and text-reading threads of the code run inside wait for their places as `client`'s."""
    token = _CLIENT.set(client)
    try:
        yield
    finally:
        _CLIENT.reset(token)


def current_client() -> str:
    return _CLIENT.get()


class FairLimit:
    """At most `capacity` holders at once, and at most `per_client` of one client (None: no such bound). A freed
    place goes to the waiting client served longest ago (one never served first; round robin while several wait); a
    client's own waiters are served in the order they came. One per event loop: its waiters are futures of the loop
    that made them."""

    def __init__(self, capacity: int, per_client: int | None = None) -> None:
        self.capacity = capacity
        self.per_client = per_client
        self.held = 0
        self._holding: dict[str, int] = {}
        self._waiting: dict[str, deque[asyncio.Future[None]]] = {}  # by client, in the order the clients came
        self._served: dict[str, int] = {}  # when each client holding or waiting last took a place
        self._ticks = 0

    def _may(self, client: str) -> bool:
        return self.held < self.capacity and (self.per_client is None
                                              or self._holding.get(client, 0) < self.per_client)

    def _take(self, client: str) -> None:
        self.held += 1
        self._holding[client] = self._holding.get(client, 0) + 1
        self._ticks += 1
        self._served[client] = self._ticks

    def _release(self, client: str) -> None:
        self.held -= 1
        self._holding[client] -= 1
        if not self._holding[client]:
            del self._holding[client]
            if client not in self._waiting:
                del self._served[client]  # nothing held or awaited: forgotten, so that the map stays small
        self._grant()

    def _grant(self) -> None:
        """Freed places to the waiting clients, the one served longest ago first, skipping those at their bound."""
        while self.held < self.capacity:
            for client in [c for c, queue in self._waiting.items() if not _live(queue)]:
                del self._waiting[client]
                if client not in self._holding:
                    self._served.pop(client, None)
            ready = [c for c in self._waiting if self._may(c)]
            if not ready:
                return
            client = min(ready, key=lambda c: self._served.get(c, 0))  # min keeps the earliest come on a tie
            queue = self._waiting[client]
            self._take(client)
            queue.popleft().set_result(None)
            if not queue:
                del self._waiting[client]

    async def acquire(self, client: str) -> None:
        """Wait for a place for `client`; the caller must `release(client)` it once done."""
        if not self._waiting and self._may(client):
            self._take(client)
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(client, deque()).append(waiter)
        self._grant()  # a free place the clients ahead cannot take (at their own bound) is this one's
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():  # given a place as it was cancelled: pass it on
                self._release(client)
            raise

    def release(self, client: str) -> None:
        self._release(client)

    @asynccontextmanager
    async def slot(self, client: str | None = None) -> AsyncIterator[None]:
        """A place for `client` (None: the client the current check runs for), held while inside."""
        name = current_client() if client is None else client
        await self.acquire(name)
        try:
            yield
        finally:
            self._release(name)


def _live(queue: deque[asyncio.Future[None]]) -> bool:
    """Whether a client still has a waiter that has not given up (those that have are dropped)."""
    while queue and queue[0].done():
        queue.popleft()
    return bool(queue)


# Threads that read text, in two lanes by how much text the work reads. Python runs one thread at a time (the GIL),
# and each thread that wants to run delays the event loop's every step by a switch interval: so long work runs in
# one thread, in turn by client, and short work beside it, one thread per client. A client's large checks then cost
# another client's small one at most one long thread's share of the interpreter, not one share per large check.
SHORT_CHARS = 20_000  # work reading less text than this (answer, passages and question) is short
SHORT_THREADS = 4
LONG_THREADS = 1
_executor: ThreadPoolExecutor | None = None
_lanes: dict[int, tuple[FairLimit, FairLimit]] = {}


def _lane(size: int) -> tuple[ThreadPoolExecutor, FairLimit]:
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(max_workers=SHORT_THREADS + LONG_THREADS, thread_name_prefix="morphguard-text")
    loop = id(asyncio.get_running_loop())
    if loop not in _lanes:
        _lanes.clear()  # one loop at a time in a process that serves; sync callers run one after another
        _lanes[loop] = (FairLimit(SHORT_THREADS, per_client=1), FairLimit(LONG_THREADS, per_client=1))
    short, long = _lanes[loop]
    return _executor, short if size < SHORT_CHARS else long


async def in_thread(func: Callable[..., T], *args: object, size: int) -> T:
    """`func(*args)` run in a text-reading thread once the current client's turn comes in the lane for work that
    reads `size` characters (as `asyncio.to_thread`, with the context carried over). The place is held until the
    thread is done, also when the caller stops waiting: a thread cannot be stopped, so a client that gives up on its
    checks does not get more threads by it."""
    executor, limit = _lane(size)
    return await _run(executor, limit, func, *args)


class Lane:
    """Threads of their own for one kind of blocking work (a verifier model's runs), taken in turn by client as the
    text-reading threads are: at most `threads` at once, one per client. Work that holds a native library's own
    threads (ONNX Runtime's) runs here rather than in the text lanes, so that it neither waits behind text reading
    nor takes its threads."""

    def __init__(self, threads: int, name: str) -> None:
        self.threads = threads
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name)
        self._limits: dict[int, FairLimit] = {}

    async def run(self, func: Callable[..., T], *args: object) -> T:
        """`func(*args)` in one of the lane's threads, once the current client's turn comes."""
        loop = id(asyncio.get_running_loop())
        if loop not in self._limits:
            self._limits = {loop: FairLimit(self.threads, per_client=1)}
        return await _run(self._executor, self._limits[loop], func, *args)


async def _run(executor: ThreadPoolExecutor, limit: FairLimit, func: Callable[..., T], *args: object) -> T:
    name = current_client()
    await limit.acquire(name)
    loop = asyncio.get_running_loop()
    try:
        call = functools.partial(contextvars.copy_context().run, func, *args)
        running = executor.submit(call)
    except BaseException:
        limit.release(name)
        raise
    # Released when the thread is done (or the work was cancelled before it started), not when the caller stops.
    running.add_done_callback(lambda _: _call_soon(loop, limit.release, name))
    return await asyncio.wrap_future(running)


def _call_soon(loop: asyncio.AbstractEventLoop, func: Callable[[str], None], arg: str) -> None:
    if not loop.is_closed():
        loop.call_soon_threadsafe(func, arg)
