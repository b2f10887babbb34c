"""The provider behind the proxy, for every dialect: the OpenAI-compatible upstream (aiohttp), Anthropic's
(`proxy.anthropic`, for Messages) and, for chat completions, the litellm routes (other providers, chosen by
model prefix). It owns each call's GenAI client span: `complete` and `stream` are context managers that open
the span and end it when they exit, whoever holds them.

The span stays open while the caller holds the call, so that the check's evaluation event lands on it and the
check's span is its child; it ends with the time the provider finished: it measures the provider, not our check.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span
from starlette.responses import Response

from morphguard import telemetry
from morphguard.policy.answers import prose
from morphguard.proxy.adapter import LitellmAdapter
from morphguard.proxy.body import loads_upstream
from morphguard.proxy.dialects.base import Dialect, Event, read_events
from morphguard.proxy.errors import json_bytes
from morphguard.proxy.upstream import Upstream, response_headers


@dataclass
class Call:
    """One call to the provider: its span, and the provider's own error response to pass on unchanged, if any."""

    span: Span
    model: str | None
    provider: str
    started: float
    server: tuple[str, int] | None = None  # the configured address and port called; None for litellm's routes
    refused: Response | None = None
    kept: dict[str, str] = field(default_factory=dict)  # provider response headers worth passing on
    answered: int = 0  # time.time_ns() when the provider's answer was all in
    ended: bool = False  # what the provider answered, or how it failed, is recorded

    def failed(self, error_type: str) -> None:
        """The call failed (`error_type`: the provider's HTTP status, an exception's class or an error code):
        its duration is recorded with it, once; the span ends with the call's context."""
        if self.ended:
            return
        telemetry.record_chat(self.span, provider=self.provider, role="upstream", request_model=self.model,
                              response_model=None, input_tokens=None, output_tokens=None,
                              seconds=time.perf_counter() - self.started, error_type=error_type, server=self.server)
        self.answered = time.time_ns()
        self.ended = True

    def _end(self) -> None:
        """The span's end, at the moment the provider finished (now, where it never did)."""
        if self.span.is_recording():
            self.span.end(end_time=self.answered or None)


@dataclass
class Reply(Call):
    """A non-streamed call: the response in the dialect's shape (validated), unless refused."""

    response: dict[str, Any] | None = None


@dataclass
class Relay(Call):
    """A streamed call: the events as they arrive, unless refused."""

    events: AsyncIterator[Event] | None = None


class Backend:
    def __init__(self, upstream: Upstream, anthropic: Upstream | None, adapter: LitellmAdapter,
                 default_provider: str) -> None:
        self.upstream = upstream
        self.anthropic = anthropic
        self.adapter = adapter
        self.default_provider = default_provider

    def _upstream(self, dialect: Dialect) -> Upstream:
        return self.anthropic or self.upstream if dialect.provider == "anthropic" else self.upstream

    def headers_for(self, dialect: Dialect, incoming: Mapping[str, str]) -> dict[str, str]:
        upstream = self._upstream(dialect)
        headers = upstream.headers_for(incoming)
        if dialect.provider == "anthropic" and upstream.settings.api_key is not None:
            # The proxy's own key, the way Anthropic's API takes it.
            headers["x-api-key"] = headers.pop("authorization").removeprefix("Bearer ")
        headers["content-type"] = "application/json"
        return headers

    def _start(self, dialect: Dialect, body: dict[str, Any], messages: Any, factory: type[Call]) -> Call:
        model = body.get("model") if isinstance(body.get("model"), str) else None
        route = self.adapter.route_for(model) if dialect.via_litellm else None
        provider = (route.prefix.split("/")[0] if route else dialect.provider) or self.default_provider
        base = self._upstream(dialect).base
        server = None if route or not base.host else (base.host, base.port or (443 if base.scheme == "https" else 80))
        span = telemetry.start_chat_span(model, provider, "upstream", messages, server)
        return factory(span, model, provider, time.perf_counter(), server)

    def record(self, dialect: Dialect, call: Call, response: dict[str, Any] | None, text: str) -> None:
        """What the provider answered, on the call's span; the moment it finished is when the span ends."""
        usage = dialect.usage(response) if response is not None else None
        telemetry.record_chat(call.span, provider=call.provider, role="upstream", request_model=call.model,
                              response_model=usage.model if usage else None,
                              input_tokens=usage.input_tokens if usage else None,
                              output_tokens=usage.output_tokens if usage else None,
                              finish_reasons=list(usage.finish_reasons) if usage else [],
                              seconds=time.perf_counter() - call.started, output_text=text, server=call.server)
        call.answered = call.answered or time.time_ns()
        call.ended = True

    def _refused(self, call: Call) -> None:
        assert call.refused is not None
        status = call.refused.status_code
        telemetry.record_chat(call.span, provider=call.provider, role="upstream", request_model=call.model,
                              response_model=None, input_tokens=None, output_tokens=None,
                              seconds=time.perf_counter() - call.started, error=f"HTTP {status}",
                              error_type=str(status), server=call.server)

    @asynccontextmanager
    async def complete(self, dialect: Dialect, body: dict[str, Any], headers: dict[str, str],
                       messages: Any = None) -> AsyncIterator[Reply]:
        """The provider's answer, validated as the dialect's (502 otherwise), its span open until the context
        exits."""
        reply = self._start(dialect, body, messages if messages is not None else body.get("messages"), Reply)
        assert isinstance(reply, Reply)
        try:
            try:
                with trace.use_span(reply.span, end_on_exit=False, record_exception=True):
                    raw = await self._send(dialect, reply, body, headers)
                if reply.refused is not None:
                    self._refused(reply)
                else:
                    reply.response = raw
                    self.record(dialect, reply, raw, prose(dialect.completion(raw)))
            except BaseException as exc:
                reply.failed(type(exc).__qualname__)
                raise
            yield reply
        finally:
            reply._end()

    async def _send(self, dialect: Dialect, reply: Reply, body: dict[str, Any], headers: dict[str, str]) -> Any:
        route = self.adapter.route_for(body.get("model")) if dialect.via_litellm else None
        if route is not None:
            answer = await self.adapter.complete(route, body)
            reply.answered = time.time_ns()
            return answer
        async with self._upstream(dialect).open("POST", dialect.name, headers, json_bytes(body)) as response:
            data = await response.read()
        reply.answered = time.time_ns()
        if response.status_code >= 400:
            reply.refused = Response(data, response.status_code,
                                     headers=response_headers(response.headers, body="decoded"))
            return None
        reply.kept = response_headers(response.headers, body="ours")
        return loads_upstream(data)

    @asynccontextmanager
    async def stream(self, dialect: Dialect, body: dict[str, Any], headers: dict[str, str],
                     messages: Any = None) -> AsyncIterator[Relay]:
        """The provider's stream and its span, open until the context exits."""
        relay = self._start(dialect, body, messages if messages is not None else body.get("messages"), Relay)
        assert isinstance(relay, Relay)
        async with AsyncExitStack() as opened:
            try:
                with trace.use_span(relay.span, end_on_exit=False, record_exception=True):
                    route = self.adapter.route_for(relay.model) if dialect.via_litellm else None
                    if route is not None:
                        relay.events = _unnamed(self.adapter.stream(route, body))
                    else:
                        try:
                            response = await opened.enter_async_context(self._upstream(dialect).open(
                                "POST", dialect.name, headers, json_bytes(body)))
                        except Exception as exc:  # the provider could not be reached
                            relay.failed(type(exc).__qualname__)
                            raise
                        if response.status_code >= 400:
                            relay.refused = Response(await response.read(), response.status_code,
                                                     headers=response_headers(response.headers, body="decoded"))
                            relay.failed(str(response.status_code))
                        else:
                            relay.kept = response_headers(response.headers, body="ours")
                            relay.events = read_events(response.lines())
                yield relay
            finally:
                relay._end()


async def _unnamed(payloads: AsyncIterator[str]) -> AsyncIterator[Event]:
    async for payload in payloads:
        yield Event(None, payload)
