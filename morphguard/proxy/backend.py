"""The provider behind the proxy: one chat interface over the OpenAI-compatible upstream (aiohttp) and the
litellm routes (other providers, chosen by model prefix), owning each call's GenAI client span.

The span stays open after the provider has answered, so that the check's evaluation event lands on it,
and is ended by the caller at the moment the provider finished (`Reply.end`, `Relay.finished`): it
measures the provider, not our check.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span
from starlette.responses import Response

from morphguard import telemetry
from morphguard.policy.answers import prose
from morphguard.proxy.adapter import LitellmAdapter
from morphguard.proxy.body import chat_completion, loads_upstream
from morphguard.proxy.errors import json_bytes
from morphguard.proxy.streaming import StreamedAnswer, events
from morphguard.proxy.upstream import Upstream, response_headers


@dataclass
class Reply:
    """A non-streamed call: the completion, or the provider's own error response to pass on unchanged."""

    span: Span
    answered: int  # time.time_ns() when the provider's answer was in
    completion: dict[str, Any] | None = None
    refused: Response | None = None
    kept: dict[str, str] = field(default_factory=dict)  # provider response headers worth passing on

    def end(self) -> None:
        self.span.end(end_time=self.answered)


@dataclass
class Relay:
    """A streamed call: the chunk payloads as they arrive, or the provider's own error response."""

    span: Span
    model: str | None
    provider: str
    started: float
    server: tuple[str, int] | None = None
    chunks: AsyncIterator[str] | None = None
    refused: Response | None = None
    kept: dict[str, str] = field(default_factory=dict)

    def finished(self, answer: StreamedAnswer) -> int:
        """Record what the provider streamed; returns the time to end the span at."""
        telemetry.record_chat(self.span, provider=self.provider, role="upstream", request_model=self.model,
                              response_model=answer.model or None, input_tokens=None, output_tokens=None,
                              finish_reasons=[answer.finish_reason] if answer.finish_reason else [],
                              seconds=time.perf_counter() - self.started, output_text=answer.text,
                              server=self.server)
        return time.time_ns()

    def failed(self, error_type: str) -> None:
        """The call failed (`error_type`: the provider's HTTP status, an exception's class or an error code):
        its duration is recorded with it and the span ends."""
        telemetry.record_chat(self.span, provider=self.provider, role="upstream", request_model=self.model,
                              response_model=None, input_tokens=None, output_tokens=None,
                              seconds=time.perf_counter() - self.started, error_type=error_type, server=self.server)
        self.span.end()


class ChatBackend:
    def __init__(self, upstream: Upstream, adapter: LitellmAdapter, default_provider: str) -> None:
        self.upstream = upstream
        self.adapter = adapter
        self.default_provider = default_provider

    def _start(self, body: dict[str, Any]) -> tuple[Span, str | None, str, tuple[str, int] | None]:
        model = body.get("model") if isinstance(body.get("model"), str) else None
        route = self.adapter.route_for(model)
        provider = route.prefix.split("/")[0] if route else self.default_provider
        base = self.upstream.base
        server = None if route or not base.host else (base.host, base.port or (443 if base.scheme == "https" else 80))
        span = telemetry.start_chat_span(model, provider, "upstream", body.get("messages"), server)
        return span, model, provider, server

    async def complete(self, body: dict[str, Any], headers: dict[str, str]) -> Reply:
        span, model, provider, server = self._start(body)
        started = time.perf_counter()
        try:
            with trace.use_span(span, end_on_exit=False, record_exception=True):
                reply = await self._complete(body, headers, span)
        except BaseException as exc:
            telemetry.record_chat(span, provider=provider, role="upstream", request_model=model, response_model=None,
                                  input_tokens=None, output_tokens=None, seconds=time.perf_counter() - started,
                                  error_type=type(exc).__qualname__, server=server)
            span.end()
            raise
        seconds = time.perf_counter() - started
        if reply.refused is not None:
            status = reply.refused.status_code
            telemetry.record_chat(span, provider=provider, role="upstream", request_model=model, response_model=None,
                                  input_tokens=None, output_tokens=None, seconds=seconds,
                                  error=f"HTTP {status}", error_type=str(status), server=server)
        elif reply.completion is not None:
            result = reply.completion
            usage = result.get("usage")
            usage = usage if isinstance(usage, dict) else {}
            telemetry.record_chat(
                span, provider=provider, role="upstream", request_model=model,
                response_model=_string(result.get("model")), input_tokens=_int(usage.get("prompt_tokens")),
                output_tokens=_int(usage.get("completion_tokens")),
                finish_reasons=[str(c.get("finish_reason")) for c in result["choices"] if isinstance(c, dict)],
                seconds=seconds, output_text=prose(result), server=server)
        return reply

    async def _complete(self, body: dict[str, Any], headers: dict[str, str], span: Span) -> Reply:
        route = self.adapter.route_for(body.get("model"))
        if route is not None:
            completion = chat_completion(await self.adapter.complete(route, body))
            return Reply(span, time.time_ns(), completion=completion)
        async with self.upstream.open("POST", "chat/completions", headers, json_bytes(body)) as response:
            data = await response.read()
        answered = time.time_ns()
        if response.status_code >= 400:
            return Reply(span, answered, refused=Response(data, response.status_code, headers=response_headers(
                response.headers, body="decoded")))
        return Reply(span, answered, completion=chat_completion(loads_upstream(data)),
                     kept=response_headers(response.headers, body="ours"))

    @asynccontextmanager
    async def stream(self, body: dict[str, Any], headers: dict[str, str]) -> AsyncIterator[Relay]:
        """The provider's stream, open until the context exits (which also ends a span left open)."""
        span, model, provider, server = self._start(body)
        relay = Relay(span, model, provider, time.perf_counter(), server)
        async with AsyncExitStack() as opened:
            try:
                with trace.use_span(span, end_on_exit=False, record_exception=True):
                    route = self.adapter.route_for(model)
                    if route is not None:
                        relay.chunks = self.adapter.stream(route, body)
                    else:
                        try:
                            response = await opened.enter_async_context(self.upstream.open(
                                "POST", "chat/completions", headers, json_bytes(body)))
                        except Exception as exc:  # the provider could not be reached
                            relay.failed(type(exc).__qualname__)
                            raise
                        if response.status_code >= 400:
                            relay.refused = Response(await response.read(), response.status_code,
                                                     headers=response_headers(response.headers, body="decoded"))
                            relay.failed(str(response.status_code))
                        else:
                            relay.kept = response_headers(response.headers, body="ours")
                            relay.chunks = events(response.lines())
                yield relay
            finally:
                if span.is_recording():  # a stream that ended in an error or a client that left
                    span.end()


def _string(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
