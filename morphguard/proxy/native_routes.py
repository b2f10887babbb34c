"""The routes of the Responses and Messages APIs (`native.py` knows their shapes): forward, check,
write the verdict back, in the same steps as chat completions, and with the same accounting: from the
moment a request is accepted, every way out leaves one audit row."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.trace import Span
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from morphguard import telemetry
from morphguard.policy.answers import prose
from morphguard.policy.record import DecisionRecord
from morphguard.proxy.body import OFFLOAD_BYTES, loads_upstream, parse_object
from morphguard.proxy.check import CheckRequest
from morphguard.proxy.context import OUR_FIELD
from morphguard.proxy.errors import JSON, ProxyError, json_bytes, upstream_malformed, upstream_stream_broken
from morphguard.proxy.native import VERDICT_EVENT, Dialect, Event, Messages, as_completion, read_events, sse_event
from morphguard.proxy.upstream import Upstream, response_headers
from morphguard.telemetry import names

if TYPE_CHECKING:
    from morphguard.proxy.app import Proxy


class NativeRoutes:
    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy

    def _upstream(self, dialect: Dialect) -> tuple[Upstream, str]:
        """Where the dialect's requests go, and the provider name its spans carry."""
        if dialect is Messages:
            return self.proxy.anthropic or self.proxy.upstream, "anthropic"
        return self.proxy.upstream, self.proxy.config.telemetry.upstream_provider

    async def handle(self, request: Request, dialect: Dialect) -> Response:
        proxy = self.proxy
        upstream, provider = self._upstream(dialect)
        headers = upstream.headers_for(request.headers)
        if dialect is Messages and upstream.settings.api_key is not None:
            # The proxy's own key, the way Anthropic's API takes it.
            headers["x-api-key"] = headers.pop("authorization").removeprefix("Bearer ")
        headers["content-type"] = "application/json"
        raw = await proxy._read_body(request)
        if len(raw) > OFFLOAD_BYTES:
            body, view, review = await asyncio.to_thread(self._intake, request, raw, dialect)
        else:
            body, view, review = self._intake(request, raw, dialect)
        forwarded = json_bytes({k: v for k, v in body.items() if k != OUR_FIELD})
        # Accepted: from here on, every way out leaves one audit row.
        try:
            span = telemetry.start_chat_span(review.model, provider, "upstream", view["messages"])
            if body.get("stream"):
                return await self._stream(dialect, upstream, provider, headers, forwarded, review, span)
            return await self._complete(dialect, upstream, provider, headers, forwarded, review, span)
        except ProxyError as exc:
            await proxy.guard.account(review, exc.code or "upstream_error")
            raise
        except Exception:
            await proxy.guard.account(review, "internal_error")
            raise

    def _intake(self, request: Request, raw: bytes,
                dialect: Dialect) -> tuple[dict[str, Any], dict[str, Any], CheckRequest]:
        """Parse, read as a chat, extract the context, choose profile and topic: CPU work, off the loop when big."""
        body = parse_object(raw)
        view = dialect.chat_view(body)
        return body, view, self.proxy._review(request, self.proxy.extractor.extract(view))

    async def _complete(self, dialect: Dialect, upstream: Upstream, provider: str, headers: dict[str, str],
                        forwarded: bytes, review: CheckRequest, span: Span) -> Response:
        started = time.perf_counter()
        try:
            with trace.use_span(span, end_on_exit=False, record_exception=True):
                async with upstream.open("POST", dialect.path, headers, forwarded) as response:
                    data = await response.read()
        except BaseException:
            span.end()
            raise
        answered = time.time_ns()
        if response.status_code >= 400:  # the provider's own error, unchanged
            telemetry.record_chat(span, provider=provider, role="upstream", request_model=review.model,
                                  response_model=None, input_tokens=None, output_tokens=None,
                                  seconds=time.perf_counter() - started, error=f"HTTP {response.status_code}")
            span.end(end_time=answered)
            await self.proxy.guard.account(review, f"upstream_http_{response.status_code}")
            return Response(data, response.status_code,
                            headers=response_headers(response.headers, body="decoded"))
        native = loads_upstream(data)
        try:
            message = dialect.answer(native)
            _record_call(span, provider, review, native, time.perf_counter() - started, message["content"])
            native, record = await self._checked(dialect, review, native, message, span, can_change=True,
                                                 later=self.proxy.settings.mode == "async")
        finally:
            span.end(end_time=answered)
        return JSON(native, headers=response_headers(response.headers, body="ours") | record.headers())

    async def _checked(self, dialect: Dialect, review: CheckRequest, native: dict[str, Any], message: dict[str, Any],
                       span: Span, *, can_change: bool, later: bool) -> tuple[dict[str, Any], DecisionRecord]:
        """The response as the client gets it (verdict in, answer rewritten by policy) and the record;
        `later`: queue the check (async mode) unless the queue sends it back to be done now."""
        guard = self.proxy.guard
        review.chat_span = span
        span.set_attribute(names.REQUEST_ID, review.request_id)
        record = await guard.check_later(review, as_completion(message)) if later else None
        if record is None:
            with trace.use_span(span, end_on_exit=False):
                checked, record = await guard.review(review, as_completion(message), can_change=can_change)
            new_text = prose(checked)
            if can_change and (new_text != message["content"] or record.action == "block"):
                native = dialect.rewrite(native, new_text, blocked=record.action == "block")
        native = {**native, OUR_FIELD: record.payload()}
        return native, record

    async def _stream(self, dialect: Dialect, upstream: Upstream, provider: str, headers: dict[str, str],
                      forwarded: bytes, review: CheckRequest, span: Span) -> Response:
        opened = AsyncExitStack()
        started = time.perf_counter()
        try:
            with trace.use_span(span, end_on_exit=False, record_exception=True):
                response = await opened.enter_async_context(upstream.open("POST", dialect.path, headers, forwarded))
        except BaseException:
            span.end()
            raise
        if response.status_code >= 400:
            data = await response.read()
            await opened.aclose()
            span.end()
            await self.proxy.guard.account(review, f"upstream_http_{response.status_code}")
            return Response(data, response.status_code,
                            headers=response_headers(response.headers, body="decoded"))
        kept = response_headers(response.headers, body="ours")
        events = read_events(response.lines())
        if self.proxy.settings.stream_mode == "buffer":
            return await self._buffered(dialect, provider, review, span, events, opened, started, kept)
        return StreamingResponse(self._relayed(dialect, provider, review, span, events, opened, started),
                                 media_type="text/event-stream", headers=kept)

    async def _buffered(self, dialect: Dialect, provider: str, review: CheckRequest, span: Span,
                        events: AsyncIterator[Event], opened: AsyncExitStack, started: float,
                        kept: dict[str, str]) -> Response:
        """The whole stream collected and checked first: what policy changes reaches the client."""
        try:
            collected = [e async for e in events]
        except ProxyError:  # it broke off or stalled
            span.end()
            raise
        finally:
            await opened.aclose()
        native = dialect.collected(collected)
        if native is None or not collected or not dialect.is_last(collected[-1]):
            span.end()
            raise upstream_malformed("the stream ended before its last event")
        message = dialect.answer(native)
        _record_call(span, provider, review, native, time.perf_counter() - started, message["content"])
        ended = time.time_ns()
        try:
            checked, record = await self._checked(dialect, review, native, message, span, can_change=True,
                                                  later=False)
        finally:
            span.end(end_time=ended)
        verdict = sse_event(VERDICT_EVENT, {"type": VERDICT_EVENT, OUR_FIELD: record.payload()})
        if dialect.answer(checked) != message or record.action == "block":
            collected = list(dialect.synthesize({k: v for k, v in checked.items() if k != OUR_FIELD}))
        # the dialect's last event carries the verdict too, as a non-streamed response does
        out = [e.encode() for e in collected[:-1]]
        out += [verdict, dialect.with_verdict(collected[-1], record.payload()).encode()]
        return StreamingResponse(iter(out), media_type="text/event-stream", headers=kept | record.headers())

    async def _relayed(self, dialect: Dialect, provider: str, review: CheckRequest, span: Span,
                       events: AsyncIterator[Event], opened: AsyncExitStack, started: float) -> AsyncIterator[bytes]:
        """Events go out as they come; the last waits for the verdict, which goes out just before it."""
        guard = self.proxy.guard
        parts: list[str] = []
        seen: list[Event] = []
        last: Event | None = None
        recorded = False
        try:
            try:
                async for event in events:
                    seen.append(event)
                    if dialect.is_last(event):
                        last = event
                        continue
                    parts.append(dialect.delta(event))
                    yield event.encode()
                if last is None:
                    raise upstream_stream_broken("the stream ended before its last event")
            except ProxyError as exc:  # the status line is sent: say it in the stream
                await guard.account(review, exc.code or "upstream_stream_broken", "".join(parts))
                recorded = True
                span.end()
                yield sse_event("error", {"type": "error", "error": {"type": "api_error", "message": exc.message}})
                return
            finally:
                await opened.aclose()
            message = _streamed_message(dialect, seen, parts)
            telemetry.record_chat(span, provider=provider, role="upstream", request_model=review.model,
                                  response_model=None, input_tokens=None, output_tokens=None,
                                  seconds=time.perf_counter() - started, output_text=message["content"])
            ended = time.time_ns()
            try:
                _, record = await self._checked(dialect, review, {}, message, span, can_change=False,
                                                later=self.proxy.settings.stream_mode == "async")
                recorded = True
            finally:
                span.end(end_time=ended)
            yield sse_event(VERDICT_EVENT, {"type": VERDICT_EVENT, OUR_FIELD: record.payload()})
            yield dialect.with_verdict(last, record.payload()).encode()
        finally:
            if not recorded:
                if span.is_recording():
                    span.end()
                guard.account_soon(review, "client_disconnected", "".join(parts))


def _streamed_message(dialect: Dialect, events: list[Event], deltas: list[str]) -> dict[str, Any]:
    """A relayed stream's answer as a chat message: from the response its events assemble, or, where that is not
    readable (its text has gone out already, so it must still be checked), from its text deltas."""
    collected = dialect.collected(events)
    if collected is not None:
        try:
            return dialect.answer(collected)
        except ProxyError:
            pass
    return {"role": "assistant", "content": "".join(deltas)}


def _record_call(span: Span, provider: str, review: CheckRequest, native: dict[str, Any], seconds: float,
                 text: str) -> None:
    usage: dict[str, Any] = native["usage"] if isinstance(native.get("usage"), dict) else {}
    telemetry.record_chat(span, provider=provider, role="upstream", request_model=review.model,
                          response_model=native.get("model") if isinstance(native.get("model"), str) else None,
                          input_tokens=_int(usage.get("input_tokens")), output_tokens=_int(usage.get("output_tokens")),
                          seconds=seconds, output_text=text)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
