"""The proxy's routes: chat completions, the Responses API and the Anthropic Messages API are forwarded
and checked (each a dialect over the one request path of `flow`); `/v1/check` checks an answer the caller
already has (`check_api`), also in the shape of the gateways' webhooks it is handed; a short allow-list of
other /v1 paths (`proxy.passthrough_routes`) passes through; generation routes that cannot be checked are refused
unless `proxy.unchecked_routes` lets them pass (audited); anything else is 404.

Paths reach the routes in canonical form (`gate.Gate`), so there is one spelling of each route.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Mount, Route

from morphguard.config import Config
from morphguard.detectors import Detector
from morphguard.proxy import probes
from morphguard.proxy.adapter import LitellmAdapter
from morphguard.proxy.backend import Backend
from morphguard.proxy.check_api import CheckApi, Webhook
from morphguard.proxy.dialects.chat import ChatCompletions
from morphguard.proxy.dialects.messages import Messages
from morphguard.proxy.dialects.responses import Responses
from morphguard.proxy.errors import (
    ProxyError,
    handle_http_error,
    handle_proxy_error,
    handle_unexpected,
    not_found,
    unchecked_route,
)
from morphguard.proxy.flow import Flow
from morphguard.proxy.gate import Gate
from morphguard.proxy.upstream import Upstream, response_headers
from morphguard.settle.guard import Guard, start
from morphguard.telemetry.server import ServerSpans

log = logging.getLogger(__name__)

CHAT, RESPONSES, MESSAGES = ChatCompletions(), Responses(), Messages()

# Upstream paths that generate text. Chat completions, Responses and Messages are checked on routes of their own;
# a path under one of these that reaches `forward` instead (the legacy completions, audio, a Responses sub-path, ...)
# is refused unless `proxy.unchecked_routes` names it.
GENERATION_ROUTES = frozenset({"completions", "responses", "messages", "batches", "threads", "assistants",
                               "realtime", "chat", "audio", "images", "fine_tuning"})


class Proxy:
    def __init__(self, config: Config, detector: Detector | None = None,
                 webhooks: Mapping[str, Webhook] | None = None) -> None:
        self.config = config
        self.settings = config.proxy
        self._detector = detector
        self._webhooks = webhooks
        self.upstream: Upstream
        self.anthropic: Upstream | None = None  # /v1/messages, when not the main upstream
        self.guard: Guard
        self.flow: Flow

    @asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self.guard = await start(self.config, self._detector)
        self.upstream = Upstream(self.settings)
        self.anthropic = Upstream(self.settings.model_copy(update={"upstream": self.settings.anthropic})) \
            if self.settings.anthropic is not None else None
        adapter = LitellmAdapter(self.settings.litellm_routes, self.settings.upstream.timeout_s)
        backend = Backend(self.upstream, self.anthropic, adapter, self.config.telemetry.upstream_provider)
        self.flow = Flow(self.config, self.guard.engine, backend, self.guard)
        # What is loaded by now (litellm, pydantic models, ~370k objects) lives as long as the process: out of
        # the collector's sight, a full collection no longer stalls every request in flight (~150-200 ms here).
        gc.freeze()
        try:
            yield
        finally:
            await self.guard.drain()
            await self.upstream.aclose()
            if self.anthropic is not None:
                await self.anthropic.aclose()
            await self.guard.stop()

    def app(self) -> Gate:
        route_headers = frozenset(h for r in self.config.policy.routes for h in r.headers)
        console: list[BaseRoute] = []
        if self.config.review.mount_in_serve:
            from morphguard.review.app import ReviewConsole, reviewer_keys

            keys, _ = reviewer_keys(self.config.review)
            # Paths reach routes without a trailing slash (gate.Gate), so /review itself needs its own route.
            console = [Route("/review", lambda _: RedirectResponse("/review/queue", status_code=303)),
                       Mount("/review", ReviewConsole(self.config.review, lambda: self.guard.audit, keys,
                                                      list(self.config.policy.topics)).app())]
        return Gate(ServerSpans(Starlette(
            routes=[
                Route("/v1/chat/completions", self.chat, methods=["POST"]),  # first: the router tries routes in order
                *CheckApi(self.settings, lambda: self.flow, self._webhooks).routes(),
                Route("/healthz", probes.healthz, methods=["GET"]),
                Route("/readyz", self.readyz, methods=["GET"]),
                Route("/metrics", probes.metrics, methods=["GET"]),
                *console,
                Route("/v1/responses", self.responses, methods=["POST"]),
                Route("/v1/messages", self.messages, methods=["POST"]),
                Route("/v1/{path:path}", self.forward, methods=["GET", "POST", "PUT", "PATCH", "DELETE"]),
                # A path prefix (base_url http://proxy/clinic/v1) can select a policy profile.
                Route("/{prefix:path}/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/{prefix:path}/v1/responses", self.responses, methods=["POST"]),
                Route("/{prefix:path}/v1/messages", self.messages, methods=["POST"]),
                Route("/{prefix:path}/v1/{path:path}", self.forward, methods=["GET", "POST", "PUT", "PATCH", "DELETE"]),
            ],
            exception_handlers={ProxyError: handle_proxy_error, HTTPException: handle_http_error,
                                Exception: handle_unexpected},
            lifespan=self.lifespan,
        )), extra_single=route_headers)

    async def readyz(self, request: Request) -> Response:
        return await probes.readyz(self.guard, upstream=await self.upstream.reachable())

    async def chat(self, request: Request) -> Response:
        return await self.flow.handle(request, CHAT)

    async def responses(self, request: Request) -> Response:
        return await self.flow.handle(request, RESPONSES)

    async def messages(self, request: Request) -> Response:
        return await self.flow.handle(request, MESSAGES)

    async def forward(self, request: Request) -> Response:
        """An allow-listed /v1 path: bytes through, status and headers kept, streaming included."""
        path = request.path_params["path"]
        first = path.split("/", 1)[0]
        unchecked = first in self.settings.unchecked_routes
        if first not in self.settings.passthrough_routes and not unchecked:
            if first in GENERATION_ROUTES:
                raise unchecked_route(f"/v1/{path}")
            raise not_found(request.url.path)
        headers = self.upstream.headers_for(request.headers)
        body = await self.flow.read_body(request)
        if unchecked:
            await self.guard.account(self.flow.bare_intake(request), "unchecked_route")
        opened = AsyncExitStack()
        response = await opened.enter_async_context(self.upstream.open(
            request.method, path, headers, body or None, params=request.query_params.multi_items(), decoded=False))

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for part in response.raw():
                    yield part
            except ProxyError as exc:  # headers are sent: all we can do is end the body early
                log.warning("pass-through body from upstream broke: %s", exc.message)
            finally:
                await opened.aclose()

        return StreamingResponse(relay(), status_code=response.status_code,
                                 headers=response_headers(response.headers, body="as_sent"))


def create_app(config: Config, detector: Detector | None = None,
               webhooks: Mapping[str, Webhook] | None = None) -> Gate:
    """The proxy's app; `webhooks`: the gateways' webhook guardrails it serves at /v1/check/<name>."""
    return Proxy(config, detector, webhooks).app()
