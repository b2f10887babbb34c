"""Fair shares of what checks wait for: who a check runs for, and places taken in turn by client.

A check runs on behalf of a client (`on_behalf_of`: the checker opens it around the check, with a digest of who is
asking, `client_id`: the request path names the client by the identity the proxy authenticated, else by where the
request came from, never by a key it merely presents), and every judge call (`judge.concurrency`, a
served verifier's too) and blocking thread of the check (`lanes`) waits for its place in a `FairLimit` under that
client's name. While places are taken, a freed one goes to the waiting client served longest ago (round robin), each
client's own waiters first come first served: a client sending many large checks at once waits behind its own work,
not in front of everyone else's.

`FairLimit` is our own: anyio's `CapacityLimiter` (which the thread lanes use to bound their threads) hands a freed
token to whoever waited first, with no notion of a client, no turn and no bound per client.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import deque
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar

_CLIENT: ContextVar[str] = ContextVar("morphguard_client", default="")


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
