"""One accepted request on its way through the proxy (`Exchange`), and what a stream mode may ask of the request
path (`Steps`): `proxy.flow` hands both to the stream mode it chose for the request (`proxy.stream_modes`)."""

from __future__ import annotations

from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, Protocol

from starlette.responses import Response

from morphguard.policy.engine import Reach
from morphguard.proxy.backend import Call, Relay
from morphguard.proxy.dialects.base import Dialect
from morphguard.settle.stream_checks import Streaming
from morphguard.settle.values import Answer, CheckRequest, Settled


@dataclass
class Exchange:
    dialect: Dialect
    body: dict[str, Any]  # what goes upstream: the client's body less our own field
    view: dict[str, Any]  # the request as a chat (the dialect's `chat_view`)
    intake: CheckRequest  # the request as policy sees it
    headers: dict[str, str]  # for the provider


class Steps(Protocol):
    """The steps of the request path a stream mode runs, and nothing else of it: a mode never sees the guard, the
    checker or the policy engine."""

    def answered(self, exchange: Exchange, call: Call, answer: Answer) -> None:
        """What the provider answered, on its call's span (the moment it finished)."""

    async def check(self, exchange: Exchange, answer: Answer, reach: Reach) -> Settled:
        """Check → decide → act → audit, as far as `reach` lets policy act: the answer as policy leaves it (its
        response written back in the API's shape, not yet carrying the verdict) and the record."""

    async def check_later(self, exchange: Exchange, answer: Answer, reach: Reach) -> Settled:
        """The check queued (`proxy.mode: async`): the answer as it is, with the record that says so; or, where
        the queue sends it back (`proxy.on_queue_full: inline`), `check` now."""

    def stream(self, exchange: Exchange) -> Streaming:
        """What the stream needs of the settle side, handed over once: the engine that checks it as it flows, its
        journal entry once text goes out, its row where it ends without a verdict."""


class StreamMode(Protocol):
    """How a stream reaches the client: relayed as it comes, collected and checked first, or checked as it flows."""

    name: str  # what the response's `x-morphguard-stream` header says

    async def respond(self, steps: Steps, exchange: Exchange, relay: Relay, opened: AsyncExitStack) -> Response:
        """The response; `opened` holds the provider's stream and its span open until the mode is done with
        them."""
