"""Fair shares of the judge's places and the text-reading threads: the order clients are admitted in."""

from __future__ import annotations

import asyncio
import threading

import pytest

from morphguard.llm import fair
from morphguard.llm.fair import FairLimit, client_id, in_thread, on_behalf_of
from tests.llm.test_client import client
from tests.scripted_llm import ScriptedLLM


async def admitted_order(limit: FairLimit, arrivals: list[str], held_by: str) -> list[str]:
    """The order in which `arrivals` (client names, in the order they come) get a place of a full `limit`, each
    holding it until the next is let in."""
    order: list[str] = []
    first = asyncio.Event()

    async def holder() -> None:
        async with limit.slot(held_by):
            first.set()
            await asyncio.sleep(0.01)

    async def one(name: str, n: int) -> None:
        async with limit.slot(name):
            order.append(f"{name}{n}")
            await asyncio.sleep(0)

    holding = asyncio.ensure_future(holder())
    await first.wait()
    tasks = []
    for n, name in enumerate(arrivals, 1):
        tasks.append(asyncio.ensure_future(one(name, n)))
        await asyncio.sleep(0)  # each queued before the next arrives
    await asyncio.gather(holding, *tasks)
    return order


def test_a_freed_place_goes_to_the_waiting_client_served_longest_ago():
    order = asyncio.run(admitted_order(FairLimit(1), ["a", "a", "a", "b", "c", "b"], held_by="a"))
    # a holds a place already: the others first, then in turn, each client's own calls in the order they came
    assert order == ["b4", "c5", "a1", "b6", "a2", "a3"]


def test_one_client_may_hold_no_more_than_its_share_however_many_places_are_free():
    async def run() -> tuple[int, int]:
        limit = FairLimit(4, per_client=1)
        release = asyncio.Event()
        inside: dict[str, int] = {"a": 0, "b": 0}

        async def one(name: str) -> None:
            async with limit.slot(name):
                inside[name] += 1
                await release.wait()

        tasks = [asyncio.ensure_future(one(n)) for n in ("a", "a", "a", "b")]
        await asyncio.sleep(0.01)
        seen = (inside["a"], inside["b"])
        release.set()
        await asyncio.gather(*tasks)
        return seen

    assert asyncio.run(run()) == (1, 1)


def test_a_waiter_that_gives_up_passes_its_turn_on():
    async def run() -> list[str]:
        limit = FairLimit(1)
        order: list[str] = []
        gate = asyncio.Event()

        async def one(name: str, hold: asyncio.Event | None = None) -> None:
            async with limit.slot(name):
                order.append(name)
                if hold is not None:
                    await hold.wait()

        first = asyncio.ensure_future(one("a", gate))
        await asyncio.sleep(0)
        quitter = asyncio.ensure_future(one("b"))
        later = asyncio.ensure_future(one("c"))
        await asyncio.sleep(0)
        quitter.cancel()
        gate.set()
        await asyncio.gather(first, later)
        with pytest.raises(asyncio.CancelledError):
            await quitter
        assert limit.held == 0
        return order

    assert asyncio.run(run()) == ["a", "c"]


def test_the_judge_serves_a_second_client_before_the_rest_of_the_first_ones_calls():
    with ScriptedLLM(lambda body: "ok", delay_s=0.05) as server:
        llm = client(server, concurrency=1)

        async def ask(who: str, n: int) -> None:
            with on_behalf_of(client_id(who)):
                await llm.complete([{"role": "user", "content": f"{who}{n}"}])

        async def run() -> None:
            many = [asyncio.ensure_future(ask("sk-heavy", n)) for n in range(1, 5)]
            await asyncio.sleep(0.01)  # the heavy client's calls queue first
            await asyncio.gather(*many, ask("sk-light", 1))

        asyncio.run(run())
    asked = [r["messages"][0]["content"] for r in server.requests]
    assert asked.index("sk-light1") == 1  # next in turn, not behind the heavy client's three waiting calls


def test_text_work_runs_in_a_thread_as_the_current_clients():
    async def run() -> tuple[str, int]:
        with on_behalf_of("abc"):
            return await in_thread(lambda: (fair.current_client(), threading.get_ident()), size=0)

    name, thread = asyncio.run(run())
    assert name == "abc" and thread != threading.get_ident()
    assert client_id("sk-secret") != "sk-secret" and len(client_id("sk-secret")) == 16 and client_id(None) == ""


def test_a_client_that_stops_waiting_keeps_its_thread_place_until_the_thread_is_done():
    """A thread cannot be stopped: giving up on a check must not free a place for more of the same client's work."""
    async def run() -> list[str]:
        order: list[str] = []
        started, finish = threading.Event(), threading.Event()

        def long() -> None:
            started.set()
            finish.wait(5)
            order.append("first done")

        with on_behalf_of("heavy"):
            first = asyncio.ensure_future(in_thread(long, size=10))
            await asyncio.to_thread(started.wait, 5)
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first
            second = asyncio.ensure_future(in_thread(order.append, "second ran", size=10))
            await asyncio.sleep(0.05)
            assert not second.done()  # waits for the first thread, which still runs
            finish.set()
            await second
        return order

    assert asyncio.run(run()) == ["first done", "second ran"]


def test_long_text_work_runs_one_at_a_time_and_short_work_goes_past_it():
    async def run() -> list[str]:
        order: list[str] = []
        started, finish = threading.Event(), threading.Event()

        def long_work() -> None:
            started.set()
            finish.wait(5)
            order.append("long a")

        with on_behalf_of("a"):
            first = asyncio.ensure_future(in_thread(long_work, size=fair.SHORT_CHARS))
        await asyncio.to_thread(started.wait, 5)
        with on_behalf_of("b"):
            second = asyncio.ensure_future(in_thread(order.append, "long b", size=10 * fair.SHORT_CHARS))
            await in_thread(order.append, "short b", size=100)  # not behind the long work of either client
        await asyncio.sleep(0.05)
        assert not second.done()  # the long lane is taken by a's work
        finish.set()
        await asyncio.gather(first, second)
        return order

    assert asyncio.run(run()) == ["short b", "long a", "long b"]


def test_a_lane_runs_work_in_its_own_thread_a_second_client_before_the_rest_of_the_first_ones():
    lane = fair.Lane(1, "test-lane")
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
    assert all(thread.startswith("test-lane") for _, thread in ran)
