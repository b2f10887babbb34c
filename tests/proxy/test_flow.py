"""The request path: its intake (`flow.accept`: who a check is on behalf of, for fair turns at the judge), and the
provider's stream it holds open for a stream mode."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

import pytest
from opentelemetry.trace import INVALID_SPAN
from starlette.requests import ClientDisconnect
from starlette.responses import StreamingResponse

from morphguard.config import Config
from morphguard.policy.engine import PolicyEngine, RequestFacts
from morphguard.proxy.backend import Relay
from morphguard.proxy.context import Extraction
from morphguard.proxy.dialects.base import Event
from morphguard.proxy.dialects.chat import ChatCompletions
from morphguard.proxy.exchange import Exchange
from morphguard.proxy.flow import Flow, accept
from morphguard.settle.values import CheckRequest

PROXY_KEY = "sk-proxy-key-0001"


def who(key: str | None, address: str | None = "10.0.0.1", prefix: str = "") -> str:
    config = Config.model_validate({"proxy": {"keys": [PROXY_KEY]}})
    facts = RequestFacts(api_key=key, address=address, path_prefix=prefix)
    return accept(PolicyEngine(config.policy), config, Extraction({}, None), facts).client


def test_a_key_the_proxy_does_not_know_names_no_one_turns_go_by_address_and_route():
    # rotating keys, a shared placeholder and none at all are one client from one address on one route
    assert who("sk-rotating-1") == who("sk-rotating-2") == who("EMPTY") == who(None) != ""
    assert who("EMPTY", "10.0.0.2") != who("EMPTY")  # another address, another client
    assert who("EMPTY", prefix="/clinic") != who("EMPTY")  # another route, another client


def test_a_proxy_key_names_its_holder_wherever_it_comes_from():
    assert who(PROXY_KEY, "10.0.0.1") == who(PROXY_KEY, "10.0.0.2") != who("sk-other", "10.0.0.1")
    assert PROXY_KEY not in who(PROXY_KEY)  # a digest, never the key


def test_a_request_handed_over_in_process_is_named_by_the_key_its_host_authenticated():
    assert who("sk-litellm-a", None) != who("sk-litellm-b", None)


class _Provider:
    """A backend whose stream records when its call (and so its span) ends."""

    def __init__(self) -> None:
        self.open = 0

    @asynccontextmanager
    async def stream(self, dialect, body, headers, messages):
        async def events():
            yield Event(None, "{}")

        self.open += 1
        try:
            yield Relay(span=INVALID_SPAN, model=None, provider="openai", started=0.0, events=events())
        finally:
            self.open -= 1


class _Mode:
    name = "test"

    def __init__(self, fails: bool) -> None:
        self.fails = fails

    async def respond(self, steps, exchange, relay, opened):
        if self.fails:
            raise RuntimeError("a bug before the response is made")

        async def body():
            async with opened:  # a mode ends the call once it has read the stream: never reached here
                async for event in relay.events:
                    yield event.encode()

        return StreamingResponse(body(), media_type="text/event-stream")


@pytest.mark.parametrize("fails", [True, False])
def test_a_streams_provider_call_ends_however_its_response_ends(fails):
    """The call's span is opened by the flow and ended in its `finally`: where the mode fails before making the
    response, and where the response is never sent (its client gone before the first byte)."""
    config = Config()
    provider = _Provider()
    flow = Flow(config, PolicyEngine(config.policy), provider, None, {m: _Mode(fails) for m in
                                                                     ("passthrough", "async", "buffer", "incremental")})
    intake = CheckRequest(body={}, rag=None, source=None, profile="general", topic="general")
    exchange = Exchange(ChatCompletions(), {"stream": True}, {"messages": []}, intake, {})

    async def gone(message):
        raise OSError("the client is gone")

    async def run() -> None:
        if fails:
            with pytest.raises(RuntimeError):
                await flow._stream(exchange)
        else:
            response = await flow._stream(exchange)
            assert provider.open == 1  # held open while the response is sent
            with pytest.raises(ClientDisconnect):
                await response({"type": "http", "asgi": {"spec_version": "2.4"}}, None, gone)
        assert provider.open == 0

    asyncio.run(run())
