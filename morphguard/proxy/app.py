"""The proxy's routes: chat completions, the Responses API and the Anthropic Messages API are forwarded
and checked (the latter two in `native_routes`); a short allow-list of other /v1 paths
(`proxy.passthrough_routes`) passes through; generation routes that cannot be checked are refused
unless `proxy.unchecked_routes` lets them pass (audited); anything else is 404.

Paths reach the routes in canonical form (`gate.Gate`), so there is one spelling of each route.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from opentelemetry import trace
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import RedirectResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Mount, Route

from morphguard.config import Config
from morphguard.detectors import Detector, build_detector
from morphguard.detectors.judges import require_judges
from morphguard.policy.answers import message_of
from morphguard.policy.engine import PolicyEngine, RequestFacts
from morphguard.proxy import probes
from morphguard.proxy.adapter import LitellmAdapter
from morphguard.proxy.backend import ChatBackend, Relay
from morphguard.proxy.body import OFFLOAD_BYTES, parse_chat
from morphguard.proxy.check import CheckRequest
from morphguard.proxy.check_api import CheckApi
from morphguard.proxy.context import OUR_FIELD, ContextExtractor, Extraction
from morphguard.proxy.errors import (
    JSON,
    ProxyError,
    bad_request,
    client_disconnected,
    handle_http_error,
    handle_proxy_error,
    handle_unexpected,
    not_found,
    too_large,
    unchecked_route,
    upstream_unavailable,
)
from morphguard.proxy.gate import Gate, bearer_token
from morphguard.proxy.guard import Guard, Reask, build_guard
from morphguard.proxy.native import Messages, Responses
from morphguard.proxy.native_routes import NativeRoutes
from morphguard.proxy.streaming import DONE, StreamedAnswer, chunk_payloads, sse
from morphguard.proxy.upstream import Upstream, response_headers
from morphguard.telemetry import names
from morphguard.telemetry import setup as telemetry_setup
from morphguard.telemetry.server import ServerSpans

log = logging.getLogger(__name__)

# Upstream routes that generate text. Only chat/completions is checked; the others are refused unless
# `proxy.unchecked_routes` names them.
GENERATION_ROUTES = frozenset({"completions", "responses", "messages", "batches", "threads", "assistants",
                               "realtime", "chat", "audio", "images", "fine_tuning"})


class Proxy:
    def __init__(self, config: Config, detector: Detector | None = None) -> None:
        self.config = config
        self.settings = config.proxy
        self.extractor = ContextExtractor(self.settings.context)
        self.engine = PolicyEngine(config.policy)
        self._detector = detector
        self.upstream: Upstream
        self.anthropic: Upstream | None = None  # /v1/messages, when not the main upstream
        self.guard: Guard
        self.native = NativeRoutes(self)

    @asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        telemetry_setup.configure(self.config.telemetry)
        detector = self._detector if self._detector is not None else await asyncio.to_thread(
            build_detector, self.config)  # may start the judge
        if self.settings.inline_via == "process" or self.settings.workers:  # else the worker pool judges, not we
            await require_judges(self.config, getattr(detector, "llm", None))
        self.upstream = Upstream(self.settings)
        self.anthropic = Upstream(self.settings.model_copy(update={"upstream": self.settings.anthropic})) \
            if self.settings.anthropic is not None else None
        adapter = LitellmAdapter(self.settings.litellm_routes, self.settings.upstream.timeout_s)
        self.backend = ChatBackend(self.upstream, adapter, self.config.telemetry.upstream_provider)
        self.guard = await asyncio.to_thread(build_guard, self.config, detector, self.engine)
        await self.guard.start()
        # What is loaded by now (litellm, pydantic models, ~370k objects) lives as long as the process: out of
        # the collector's sight, a full collection no longer stalls every request in flight (~150-200 ms here).
        gc.freeze()
        try:
            yield
        finally:
            await self.guard.stop()
            await self.upstream.aclose()
            if self.anthropic is not None:
                await self.anthropic.aclose()
            await self.guard.close()
            telemetry_setup.shutdown()

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
                *CheckApi(self).routes(),
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

    async def _read_body(self, request: Request) -> bytes:
        """The body, at most `max_body_bytes`. A client that leaves before it is complete ends the request with
        one log line: nothing was accepted yet (no audit row), and it is no server error (499)."""
        limit = self.settings.max_body_bytes
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise too_large(limit)
        body = bytearray()
        try:
            async for part in request.stream():
                body += part
                if len(body) > limit:
                    raise too_large(limit)
        except ClientDisconnect:
            log.warning("%s %s: the client left after %d bytes of its request body", request.method,
                        request.url.path, len(body))
            raise client_disconnected() from None
        return bytes(body)

    def _intake(self, request: Request, raw: bytes) -> tuple[Extraction, CheckRequest]:
        """Parse, extract the context, choose profile and topic: CPU work, run off the loop for big bodies."""
        body = parse_chat(raw)
        n = body.get("n")
        if n is not None and (type(n) is not int or n != 1):
            raise bad_request("'n' must be 1: the guard checks one answer per request.", "n")
        extraction = self.extractor.extract(body)
        return extraction, self._review(request, extraction)

    def _review(self, request: Request, extraction: Extraction) -> CheckRequest:
        options = extraction.options
        headers = {k.lower(): val for k, val in request.headers.items()}
        prefix = request.path_params.get("prefix")
        override = self.config.policy.request_override
        if options.get("detector") is not None and not override:
            raise bad_request(f"'{OUR_FIELD}.detector' may only be set when the proxy allows requests to choose "
                              "their policy (policy.request_override).", f"{OUR_FIELD}.detector")
        facts = RequestFacts(
            api_key=_presented_key(headers),
            model=extraction.body.get("model") if isinstance(extraction.body.get("model"), str) else None,
            headers=headers, path_prefix=f"/{prefix}" if prefix else "",
            requested_profile=_string(options.get("policy")) or headers.get("x-morphguard-policy"),
            requested_topic=_string(options.get("topic")) or headers.get("x-morphguard-topic"),
        )
        profile = self.engine.profile_for(facts)
        topic = self.engine.topic_for(profile, extraction.rag, facts.requested_topic)
        return CheckRequest(body=extraction.body, rag=extraction.rag, source=extraction.source, profile=profile,
                      topic=topic, model=facts.model, route=facts.path_prefix, detector=options.get("detector"))

    def _reask(self, headers: dict[str, str]) -> Reask:
        async def reask(body: dict[str, Any]) -> dict[str, Any]:
            reply = await self.backend.complete(body, headers)
            reply.end()
            if reply.completion is None:
                status = reply.refused.status_code if reply.refused is not None else "none"
                raise upstream_unavailable(f"HTTP {status} on regeneration")
            return reply.completion

        return reask

    async def responses(self, request: Request) -> Response:
        return await self.native.handle(request, Responses)

    async def messages(self, request: Request) -> Response:
        return await self.native.handle(request, Messages)

    async def chat(self, request: Request) -> Response:
        headers = self.upstream.headers_for(request.headers)
        headers["content-type"] = "application/json"
        raw = await self._read_body(request)
        if len(raw) > OFFLOAD_BYTES:
            extraction, review = await asyncio.to_thread(self._intake, request, raw)
        else:
            extraction, review = self._intake(request, raw)
        # Accepted: from here on, every way out leaves one audit row.
        try:
            return await self._chat(headers, extraction, review)
        except ProxyError as exc:
            await self.guard.account(review, exc.code or "upstream_error")
            raise
        except Exception:  # a bug of ours: the client gets a 500, the audit trail still gets its row
            await self.guard.account(review, "internal_error")
            raise

    async def _chat(self, headers: dict[str, str], extraction: Extraction, review: CheckRequest) -> Response:
        if extraction.body.get("stream"):
            return await self._chat_stream(headers, extraction, review)
        reply = await self.backend.complete(extraction.body, headers)
        try:
            if reply.completion is None:  # the provider's own error, unchanged
                assert reply.refused is not None
                await self.guard.account(review, f"upstream_http_{reply.refused.status_code}")
                return reply.refused
            review.chat_span = reply.span
            reply.span.set_attribute(names.REQUEST_ID, review.request_id)
            completion, record = reply.completion, None
            if self.settings.mode == "async":
                record = await self.guard.check_later(review, completion)
            if record is None:
                with trace.use_span(reply.span, end_on_exit=False):
                    completion, record = await self.guard.review(review, completion, reask=self._reask(headers))
        finally:
            reply.end()  # the span measures the upstream call, not our check
        completion[OUR_FIELD] = record.payload()
        return JSON(completion, headers=reply.kept | record.headers())

    async def _chat_stream(self, headers: dict[str, str], extraction: Extraction, review: CheckRequest) -> Response:
        opened = AsyncExitStack()  # holds the provider's stream open until the response is done with it
        relay = await opened.enter_async_context(self.backend.stream(extraction.body, headers))
        if relay.chunks is None:
            await opened.aclose()
            assert relay.refused is not None
            await self.guard.account(review, f"upstream_http_{relay.refused.status_code}")
            return relay.refused
        relay.span.set_attribute(names.REQUEST_ID, review.request_id)
        review.chat_span = relay.span
        if self.settings.stream_mode == "buffer":
            return await self._buffered(headers, review, relay, opened)
        return StreamingResponse(self._relayed(review, relay, opened), media_type="text/event-stream",
                                 headers=relay.kept)

    async def _buffered(self, headers: dict[str, str], review: CheckRequest, relay: Relay,
                        opened: AsyncExitStack) -> Response:
        """Collect the whole stream, check it, then send it: the only stream mode that can change the answer."""
        assert relay.chunks is not None
        answer = StreamedAnswer()
        try:
            payloads = [p async for p in chunk_payloads(relay.chunks, answer)]
        except BaseException as exc:
            relay.failed(type(exc).__name__)
            raise
        finally:
            await opened.aclose()
        ended = relay.finished(answer)
        try:
            with trace.use_span(relay.span, end_on_exit=False):
                reviewed, record = await self.guard.review(review, answer.as_completion(),
                                                           reask=self._reask(headers))
        finally:
            relay.span.end(end_time=ended)
        message = message_of(reviewed)
        if message != message_of(answer.as_completion()):
            finish = reviewed["choices"][0].get("finish_reason") or "stop"
            out = [sse(c) for c in answer.replacement_chunks(message, finish)]
        else:
            out = [b"data: " + p.encode() + b"\n\n" for p in payloads]
        out += [sse(answer.decision_chunk(record.payload())), DONE]
        return StreamingResponse(iter(out), media_type="text/event-stream", headers=relay.kept | record.headers())

    async def _relayed(self, review: CheckRequest, relay: Relay, opened: AsyncExitStack) -> AsyncIterator[bytes]:
        """Chunks go out as they come; the verdict follows as one more chunk (checked now, or queued)."""
        assert relay.chunks is not None
        answer = StreamedAnswer()
        recorded = False  # a client that leaves mid-stream cancels us; its row is written all the same
        try:
            try:
                try:
                    async for payload in chunk_payloads(relay.chunks, answer):
                        yield b"data: " + payload.encode() + b"\n\n"
                finally:
                    await opened.aclose()
            except ProxyError as exc:  # the status line is sent: say it in the stream, the SDK raises it
                relay.failed(exc.code or "stream_error")
                log.warning("request %s: upstream stream failed: %s", review.request_id, exc.message)
                await self.guard.account(review, exc.code or "upstream_stream_broken", answer.text)
                recorded = True
                yield sse(exc.payload())  # an `error` event: the official SDKs raise it as an APIError
                return
            ended = relay.finished(answer)
            try:
                completion = answer.as_completion()
                record = (await self.guard.check_later(review, completion)
                          if self.settings.stream_mode == "async" else None)
                if record is None:
                    with trace.use_span(relay.span, end_on_exit=False):
                        _, record = await self.guard.review(review, completion, can_change=False)
                recorded = True
            finally:
                relay.span.end(end_time=ended)
            yield sse(answer.decision_chunk(record.payload()))
            yield DONE
        finally:
            if not recorded:
                if relay.span.is_recording():
                    relay.span.end()
                self.guard.account_soon(review, "client_disconnected", answer.text)

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
        body = await self._read_body(request)
        if unchecked:
            await self.guard.account(self._bare_review(request), "unchecked_route")
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

    def _bare_review(self, request: Request) -> CheckRequest:
        """The request as policy sees it when there is no chat body to read."""
        headers = {k.lower(): val for k, val in request.headers.items()}
        prefix = request.path_params.get("prefix")
        facts = RequestFacts(api_key=_presented_key(headers),
                             headers=headers, path_prefix=f"/{prefix}" if prefix else "")
        profile = self.engine.profile_for(facts)
        return CheckRequest(body={}, rag=None, source=None, profile=profile, topic=self.engine.topic_for(profile, None),
                      route=facts.path_prefix)


def _presented_key(headers: dict[str, str]) -> str | None:
    """The client's key: a bearer token (OpenAI's clients; the scheme in any case, any white space after it, as
    providers take it) or x-api-key (Anthropic's). Another scheme's value counts whole, as it always has."""
    authorization = headers.get("authorization", "")
    return bearer_token(authorization) or authorization.strip() or headers.get("x-api-key") or None


def _string(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def create_app(config: Config, detector: Detector | None = None) -> Gate:
    return Proxy(config, detector).app()
