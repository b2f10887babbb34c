"""One accepted request on its way through the proxy (`Exchange`), and what a stream mode may do with it
(`Steps`): the request path of `proxy.flow` hands both to the stream mode `proxy.stream_mode` names."""

from __future__ import annotations

from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, Protocol

from starlette.responses import Response

from morphguard.policy.record import DecisionRecord
from morphguard.proxy.backend import Backend, Call, Relay
from morphguard.proxy.check import CheckRequest
from morphguard.proxy.dialects.base import Dialect
from morphguard.proxy.guard import Guard


@dataclass
class Exchange:
    dialect: Dialect
    body: dict[str, Any]  # what goes upstream: the client's body less our own field
    view: dict[str, Any]  # the request as a chat (the dialect's `chat_view`)
    intake: CheckRequest  # the request as policy sees it
    headers: dict[str, str]  # for the provider


class Steps(Protocol):
    backend: Backend
    guard: Guard

    async def check(self, exchange: Exchange, call: Call, response: dict[str, Any] | None,
                    completion: dict[str, Any], *, can_change: bool,
                    later: bool) -> tuple[dict[str, Any] | None, DecisionRecord]:
        """Check → decide → act → audit: the response as policy leaves it (not yet carrying the verdict) and the
        record. `later`: queue the check, unless the queue sends it back to be done now. `can_change`: the
        answer has not gone out yet."""


class StreamMode(Protocol):
    """How a stream reaches the client: relayed as it comes, collected and checked first, or as a mode adds."""

    async def respond(self, steps: Steps, exchange: Exchange, relay: Relay, opened: AsyncExitStack) -> Response:
        """The response; `opened` holds the provider's stream open until the mode is done with it."""
