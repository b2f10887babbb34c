"""One accepted request on its way through the proxy (`Exchange`), and what a stream mode may ask of the request
path (`Steps`): `proxy.flow` hands both to the stream mode it chose for the request (`proxy.stream_modes`)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, Protocol

from starlette.responses import Response

from morphguard.policy.engine import Reach
from morphguard.proxy.backend import Call, Relay
from morphguard.proxy.dialects.base import Dialect
from morphguard.settle.incremental import Checks
from morphguard.settle.stream_journal import OpenStream
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

    window: int  # a stream checked as it flows: how many new sentences a prefix check waits for
    hold_s: float  # ... and how long a finished sentence waits for others to fill a judge call

    def answered(self, exchange: Exchange, call: Call, answer: Answer) -> None:
        """What the provider answered, on its call's span (the moment it finished)."""

    async def check(self, exchange: Exchange, answer: Answer, reach: Reach) -> Settled:
        """Check → decide → act → audit, as far as `reach` lets policy act: the answer as policy leaves it (its
        response written back in the API's shape, not yet carrying the verdict) and the record."""

    async def check_later(self, exchange: Exchange, answer: Answer, reach: Reach) -> Settled:
        """The check queued (`proxy.mode: async`): the answer as it is, with the record that says so; or, where
        the queue sends it back (`proxy.on_queue_full: inline`), `check` now."""

    def checks(self, exchange: Exchange, whole: Callable[[], Answer]) -> Checks:
        """The checks of a stream checked as it flows (`proxy.incremental.Checks`); `whole`: the whole answer
        once the upstream has ended, as the dialect reads it."""

    async def account(self, exchange: Exchange, reason: str, text: str) -> None:
        """The audit row of a stream that ends without a verdict (`reason`), with the text read so far."""

    def account_soon(self, exchange: Exchange, reason: str, text: str, sent: int | None = None,
                     stream: OpenStream | None = None) -> None:
        """`account` from where awaiting is no longer possible (a client that left); `sent`: how many characters
        of the answer's text the client was sent; `stream`: its journal entry, ended once the row is written."""

    def open_stream(self, exchange: Exchange) -> OpenStream | None:
        """Journal the stream before its first text goes out: a crash then leaves its row all the same."""


class StreamMode(Protocol):
    """How a stream reaches the client: relayed as it comes, collected and checked first, or checked as it flows."""

    name: str  # what the response's `x-morphguard-stream` header says

    async def respond(self, steps: Steps, exchange: Exchange, relay: Relay, opened: AsyncExitStack) -> Response:
        """The response; `opened` holds the provider's stream and its span open until the mode is done with
        them."""
