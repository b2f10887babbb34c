"""A server span per HTTP request, continuing the caller's trace (`traceparent`), as plain ASGI middleware.

With no tracer provider installed and no `traceparent` sent, there is no trace to continue or record:
the request goes straight through (the span would be a no-op, and its bookkeeping is not free).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from opentelemetry import propagate
from opentelemetry.trace import SpanKind, Status, StatusCode

from morphguard.telemetry import names, setup, tracer, tracing

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]
_ROUTES = ("/chat/completions", "/responses", "/messages", "/healthz", "/readyz", "/metrics")
_PASSED_THROUGH = "/v1/{path}"  # every other /v1 path, as one route: a span name is no place for a client's path


class ServerSpans:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Any]],
                       send: Callable[[Any], Awaitable[None]]) -> None:
        if scope["type"] != "http" or not (tracing() or _continues_a_trace(scope)) \
                or setup.options.excluded.url_disabled(scope["path"]):
            await self.app(scope, receive, send)
            return
        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}
        parent = propagate.extract(carrier)
        method, path = scope["method"], scope["path"]
        route = next((r for r in _ROUTES if path.endswith(r)), _PASSED_THROUGH if "/v1/" in path else None)
        attributes = {names.HTTP_METHOD: method, names.URL_PATH: path}
        if route:
            attributes[names.HTTP_ROUTE] = route
        name = names.SPAN_SERVER.format(method=method, route=route) if route else method
        with tracer().start_as_current_span(name, context=parent, kind=SpanKind.SERVER, attributes=attributes) as span:
            async def send_with_status(message: Any) -> None:
                if message["type"] == "http.response.start":
                    status = int(message["status"])
                    span.set_attribute(names.HTTP_STATUS, status)
                    if status >= 500:
                        span.set_status(Status(StatusCode.ERROR))
                    trace_id = span.get_span_context()
                    if trace_id.is_valid:
                        message.setdefault("headers", [])
                        message["headers"] = [*message["headers"],
                                              (b"x-morphguard-trace-id", f"{trace_id.trace_id:032x}".encode())]
                await send(message)

            await self.app(scope, receive, send_with_status)


def _continues_a_trace(scope: Scope) -> bool:
    return any(name == b"traceparent" for name, _ in scope.get("headers", ()))
