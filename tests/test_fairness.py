"""Fair shares of the judge's places: the order clients are admitted in, and who a check runs for."""

from __future__ import annotations

import asyncio

import pytest

from morphguard.fairness import FairLimit, client_id, on_behalf_of
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
            while not server.requests:  # the heavy client's first call holds the one place, its others queue behind
                await asyncio.sleep(0.005)
            await asyncio.gather(*many, ask("sk-light", 1))

        asyncio.run(run())
    asked = [r["messages"][0]["content"] for r in server.requests]
    assert asked.index("sk-light1") == 1  # next in turn, not behind the heavy client's three waiting calls


def test_a_client_is_named_by_a_digest_never_by_its_key():
    assert client_id("sk-secret") != "sk-secret" and len(client_id("sk-secret")) == 16 and client_id(None) == ""
