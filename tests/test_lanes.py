"""Threads taken in turn by client: the text-reading lanes and a lane of its own, and a place held until its thread
ends."""

from __future__ import annotations

import asyncio
import sys
import threading
from typing import Any

import anyio
import pytest

from morphguard import lanes
from morphguard.fairness import current_client, on_behalf_of
from morphguard.lanes import in_thread


class Held:
    """Work that holds its thread until `finish` is set, then says `done` in `order`."""

    def __init__(self, order: list[str], done: str) -> None:
        self.order, self.done = order, done
        self.started, self.finish = threading.Event(), threading.Event()

    def __call__(self) -> None:
        self.started.set()
        self.finish.wait(5)
        self.order.append(self.done)

    async def running(self) -> None:
        await asyncio.to_thread(self.started.wait, 5)


def test_text_work_runs_in_a_thread_as_the_current_clients():
    async def run() -> tuple[str, int]:
        with on_behalf_of("abc"):
            return await in_thread(lambda: (current_client(), threading.get_ident()), size=0)

    name, thread = asyncio.run(run())
    assert name == "abc" and thread != threading.get_ident()


def test_a_client_that_stops_waiting_keeps_its_thread_place_until_the_thread_is_done():
    """A thread cannot be stopped: giving up on a check must not free a place for more of the same client's work."""
    async def run() -> list[str]:
        order: list[str] = []
        long = Held(order, "first done")
        with on_behalf_of("heavy"):
            first = asyncio.ensure_future(in_thread(long, size=10))
            await long.running()
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first
            second = asyncio.ensure_future(in_thread(order.append, "second ran", size=10))
            await asyncio.sleep(0.05)
            assert not second.done()  # waits for the first thread, which still runs
            long.finish.set()
            await second
        return order

    assert asyncio.run(run()) == ["first done", "second ran"]


def test_long_text_work_runs_one_at_a_time_and_short_work_goes_past_it():
    async def run() -> list[str]:
        order: list[str] = []
        long = Held(order, "long a")
        with on_behalf_of("a"):
            first = asyncio.ensure_future(in_thread(long, size=lanes.SHORT_CHARS))
        await long.running()
        with on_behalf_of("b"):
            second = asyncio.ensure_future(in_thread(order.append, "long b", size=10 * lanes.SHORT_CHARS))
            await in_thread(order.append, "short b", size=100)  # not behind the long work of either client
        await asyncio.sleep(0.05)
        assert not second.done()  # the long lane is taken by a's work
        long.finish.set()
        await asyncio.gather(first, second)
        return order

    assert asyncio.run(run()) == ["short b", "long a", "long b"]


def test_a_lane_runs_work_off_the_loop_a_second_client_before_the_rest_of_the_first_ones():
    lane = lanes.Lane(1)
    ran: list[tuple[str, str]] = []
    gate = threading.Event()

    def work(name: str) -> None:
        if name == "a1":
            gate.wait(5)  # the others queue meanwhile
        ran.append((name, threading.current_thread().name))

    async def main() -> None:
        async def as_client(client: str, name: str) -> None:
            with on_behalf_of(client):
                await lane.run(work, name)

        first = asyncio.ensure_future(as_client("a", "a1"))
        await asyncio.sleep(0.05)
        rest = [asyncio.ensure_future(as_client("a", "a2")), asyncio.ensure_future(as_client("a", "a3"))]
        await asyncio.sleep(0.01)
        rest.append(asyncio.ensure_future(as_client("b", "b1")))
        await asyncio.sleep(0.05)
        gate.set()
        await asyncio.gather(first, *rest)

    asyncio.run(main())
    assert [name for name, _ in ran] == ["a1", "b1", "a2", "a3"]
    assert all(thread != threading.current_thread().name for _, thread in ran)


def test_a_cancelled_caller_returns_at_once_and_its_place_stays_taken_until_its_thread_ends():
    """The one choice a lane makes over anyio's thread runner: the caller may stop waiting, its thread's place is not
    freed by it (another client's work waits for the thread, not for the caller)."""
    lane = lanes.Lane(1)
    order: list[str] = []
    long = Held(order, "a's thread done")

    async def main() -> None:
        with on_behalf_of("a"):
            first = asyncio.ensure_future(lane.run(long))
        await long.running()
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first  # at once: the thread still runs
        order.append("a's caller gone")
        with on_behalf_of("b"):
            second = asyncio.ensure_future(lane.run(order.append, "b ran"))
        await asyncio.sleep(0.05)
        assert not second.done()  # the one place is still a's
        long.finish.set()
        await second

    asyncio.run(main())
    assert order == ["a's caller gone", "a's thread done", "b ran"]



def test_two_event_loops_in_two_threads_each_take_only_their_own_loops_limits(monkeypatch):
    """Sync callers each run a loop of their own, and two threads may call at once: every wait for a place must be
    in the limits of the caller's own loop, whatever the other loop does to the lane meanwhile."""
    foreign: list[str] = []

    class Bound(lanes.FairLimit):  # notes a caller from a loop other than the one it was made in
        def __init__(self, capacity: int, per_client: int | None = None) -> None:
            super().__init__(capacity, per_client)
            self.loop = asyncio.get_running_loop()

        async def acquire(self, client: str) -> None:
            if asyncio.get_running_loop() is not self.loop:
                foreign.append(client)
            await super().acquire(client)

    monkeypatch.setattr(lanes, "FairLimit", Bound)
    lane, start, failed = lanes.Lane(2), threading.Barrier(2), []

    def hammer() -> None:
        async def calls() -> None:
            for _ in range(500):
                await lane.run(int)

        start.wait(5)
        try:
            asyncio.run(calls())
        except Exception as exc:
            failed.append(exc)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # the two threads switch as often as the interpreter lets them
    try:
        threads = [threading.Thread(target=hammer) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        sys.setswitchinterval(interval)
    assert not failed and not foreign


def test_a_caller_takes_its_own_loops_limits_even_when_another_loop_sets_the_lanes_between_its_reads():
    """The worst interleaving of two loops in two threads, made to happen every time: right after each read of the
    lane's limits by this loop's caller, the other loop's caller sets its own. Both limits taken are still this
    loop's."""
    theirs = (asyncio.new_event_loop(), lanes.FairLimit(1, per_client=1), anyio.CapacityLimiter(1))

    class Contended(lanes.Lane):
        @property
        def _of(self) -> Any:
            read = self.__dict__["limits"]
            self.__dict__["limits"] = theirs  # the other loop's caller, run between this read and the next
            return read

        @_of.setter
        def _of(self, limits: Any) -> None:
            self.__dict__["limits"] = limits

    lane = Contended(1)

    async def taken() -> tuple[Any, ...]:
        assert await lane.run(int) == 0
        return lane._limits()

    try:
        turns, tokens = asyncio.run(taken())
    finally:
        theirs[0].close()
    assert turns is not theirs[1] and tokens is not theirs[2]
