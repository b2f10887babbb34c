"""The HTTP server's side of telemetry, as plain ASGI middleware: a server span per request, continuing the
caller's trace (`traceparent`), and the HTTP server metrics of the OpenTelemetry HTTP conventions
(`http.server.request.duration`, `http.server.active_requests`).

Our own middleware rather than the ASGI instrumentation: the span and the metrics must name the proxy's
routes as `http.route` (a bounded set, whatever path a client sends, under any mount prefix), and one layer
that already holds the span is the cheapest place for both. With no tracer provider installed and no
`traceparent` sent there is no span; with no meter provider, no metrics; with neither the request goes
straight through.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, MutableMapping
from contextlib import nullcontext
from functools import cache
from typing import Any

from opentelemetry import metrics, propagate
from opentelemetry.trace import SpanKind, Status, StatusCode

from morphguard.telemetry import names, setup, tracer, tracing

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]
_ROUTES = ("/chat/completions", "/responses", "/messages", "/healthz", "/readyz", "/metrics")
_PASSED_THROUGH = "/v1/{path}"  # every other /v1 path, as one route: a span name is no place for a client's path
# The conventions' known methods; any other is "_OTHER" on metrics (a client can send any token as a method).
_METHODS = frozenset({"CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE"})
# The conventions' advice for HTTP durations, in seconds, up to the minutes a checked stream can take.
_BOUNDARIES = [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 30.0, 60.0, 120.0]


@cache
def _instruments() -> tuple[Any, Any]:
    meter = metrics.get_meter(names.TRACER_NAME)
    return (meter.create_histogram(names.METRIC_HTTP_DURATION, unit="s",
                                   description="Duration of HTTP server requests",
                                   explicit_bucket_boundaries_advisory=_BOUNDARIES),
            meter.create_up_down_counter(names.METRIC_HTTP_ACTIVE, unit="{request}",
                                         description="Number of active HTTP server requests"))


def route_of(path: str) -> str | None:
    """The route a path is served by, from a bounded set; None for a path outside the proxy's routes."""
    return next((r for r in _ROUTES if path.endswith(r)), _PASSED_THROUGH if "/v1/" in path else None)


class ServerSpans:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Any]],
                       send: Callable[[Any], Awaitable[None]]) -> None:
        if scope["type"] != "http" or setup.options.excluded.url_disabled(scope["path"]):
            await self.app(scope, receive, send)
            return
        traced = tracing() or _continues_a_trace(scope)
        if not traced and not setup.metering:
            await self.app(scope, receive, send)
            return
        method, path = scope["method"], scope["path"]
        route = route_of(path)
        status = 0
        started = time.perf_counter()
        common = {names.HTTP_METHOD: method if method in _METHODS else "_OTHER",
                  names.URL_SCHEME: scope.get("scheme", "http")}
        duration, active = _instruments()
        if setup.metering:
            active.add(1, common)
        try:
            span_of = self._span(scope, method, path, route) if traced else nullcontext(None)
            with span_of as span:
                async def send_with_status(message: Any) -> None:
                    nonlocal status
                    if message["type"] == "http.response.start":
                        status = int(message["status"])
                        if span is not None:
                            _on_status(span, status, message)
                    await send(message)

                await self.app(scope, receive, send_with_status)
        except BaseException as exc:
            error: str | None = type(exc).__qualname__
            raise
        else:
            error = str(status) if status >= 500 else None
        finally:
            if setup.metering:
                active.add(-1, common)
                attributes: dict[str, Any] = dict(common)
                if route:
                    attributes[names.HTTP_ROUTE] = route
                if status:
                    attributes[names.HTTP_STATUS] = status
                if error or not status:
                    attributes[names.ERROR_TYPE] = error or "_OTHER"
                duration.record(time.perf_counter() - started, attributes)

    @staticmethod
    def _span(scope: Scope, method: str, path: str, route: str | None) -> Any:
        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}
        attributes = {names.HTTP_METHOD: method, names.URL_PATH: path}
        if route:
            attributes[names.HTTP_ROUTE] = route
        name = names.SPAN_SERVER.format(method=method, route=route) if route else method
        return tracer().start_as_current_span(name, context=propagate.extract(carrier), kind=SpanKind.SERVER,
                                              attributes=attributes)


def _on_status(span: Any, status: int, message: Any) -> None:
    span.set_attribute(names.HTTP_STATUS, status)
    if status >= 500:
        span.set_status(Status(StatusCode.ERROR))
        span.set_attribute(names.ERROR_TYPE, str(status))
    context = span.get_span_context()
    if context.is_valid:
        message["headers"] = [*message.get("headers", []),
                              (b"x-morphguard-trace-id", f"{context.trace_id:032x}".encode())]


def _continues_a_trace(scope: Scope) -> bool:
    return any(name == b"traceparent" for name, _ in scope.get("headers", ()))
