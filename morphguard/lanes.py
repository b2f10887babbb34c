"""Threads for blocking work, taken in turn by client: the text-reading lanes (`in_thread`) and lanes of their own
for other work (`Lane`, a verifier model's runs).

A lane runs its work in anyio's worker threads (`anyio.to_thread.run_sync`, the context carried over), at most
`threads` at once under a `CapacityLimiter` of its own (not anyio's default one, which Starlette's thread pool shares),
and hands its places out in turn by client, one per client at a time (`fairness.FairLimit`).

A place is held until the thread ends, even when the caller stops waiting (a latency budget ran out, a client went
away): a thread cannot be stopped, so a client that gives up on its checks must not get more threads by it. The
caller waits for its place and may give up then; once it has a place, the thread runs in a task of its own, which
holds the place and the lane's token until the thread returns, while the caller awaits that task through a shield
and so returns at once when cancelled.

Python runs one thread at a time (the GIL), and each thread that wants to run delays the event loop's every step by a
switch interval: so work reading long texts runs in one thread, in turn by client, and short work beside it, one
thread per client. A client's large checks then cost another client's small one at most one long thread's share of
the interpreter, not one share per large check.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import anyio.to_thread

from morphguard.fairness import FairLimit, current_client

T = TypeVar("T")

SHORT_CHARS = 20_000  # work reading less text than this (answer, passages and question) is short
SHORT_THREADS = 4
LONG_THREADS = 1


class Lane:
    """At most `threads` threads at once for one kind of blocking work, one per client, taken in turn by client.
    Work that holds a native library's own threads (ONNX Runtime's) runs in a lane of its own rather than in the text
    lanes, so that it neither waits behind text reading nor takes its places."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._of: tuple[asyncio.AbstractEventLoop, FairLimit, anyio.CapacityLimiter] | None = None
        self._running: set[asyncio.Future[Any]] = set()  # the threads' tasks until done (a caller that left holds none)

    async def run(self, func: Callable[..., T], *args: object) -> T:
        """`func(*args)` in one of the lane's threads, once the current client's turn comes."""
        turns, tokens = self._limits()
        client = current_client()
        await turns.acquire(client)
        try:
            thread = asyncio.ensure_future(_held(turns, tokens, client, func, args))
        except BaseException:
            turns.release(client)
            raise
        self._running.add(thread)
        thread.add_done_callback(self._running.discard)
        return await asyncio.shield(thread)

    def _limits(self) -> tuple[FairLimit, anyio.CapacityLimiter]:
        """The lane's limits for the running loop: one loop at a time in a process that serves; sync callers (each in
        a loop of its own) run one after another. Read once: a loop in another thread may set its own meanwhile, and
        a caller must never take that loop's limits (its waiters would be woken from a foreign thread)."""
        loop = asyncio.get_running_loop()
        of = self._of
        if of is None or of[0] is not loop:
            of = self._of = (loop, FairLimit(self.threads, per_client=1), anyio.CapacityLimiter(self.threads))
        return of[1], of[2]


async def _held(turns: FairLimit, tokens: anyio.CapacityLimiter, client: str, func: Callable[..., T],
                args: tuple[object, ...]) -> T:
    """The thread's own task: it holds the client's place, and anyio holds the lane's token (its cancellation
    shielded), until the thread returns."""
    try:
        return await anyio.to_thread.run_sync(func, *args, limiter=tokens)
    finally:
        turns.release(client)


_SHORT = Lane(SHORT_THREADS)
_LONG = Lane(LONG_THREADS)


async def in_thread(func: Callable[..., T], *args: object, size: int) -> T:
    """`func(*args)` run in a text-reading thread once the current client's turn comes in the lane for work that
    reads `size` characters (as `asyncio.to_thread`, with the context carried over)."""
    return await (_SHORT if size < SHORT_CHARS else _LONG).run(func, *args)
