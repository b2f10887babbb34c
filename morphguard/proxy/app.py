"""The proxy's routes: chat completions are forwarded and checked, every other /v1 path passes through."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import httpx
from opentelemetry import trace
from opentelemetry.trace import Span
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from morphguard import telemetry
from morphguard.config import Config, LitellmRoute
from morphguard.detectors import DETECTORS, Detector, build_detector, is_known
from morphguard.policy.actions import answer_of
from morphguard.policy.audit import AuditStore
from morphguard.policy.engine import PolicyEngine, RequestFacts
from morphguard.proxy import verdict as v
from morphguard.proxy.adapter import LitellmAdapter
from morphguard.proxy.context import OUR_FIELD, ContextExtractor, Extraction
from morphguard.proxy.errors import (
    ProxyError,
    bad_request,
    handle_proxy_error,
    handle_unexpected,
    too_large,
    upstream_unavailable,
)
from morphguard.proxy.escalation import Escalator
from morphguard.proxy.guard import Guard, Reask, Review
from morphguard.proxy.streaming import DONE, StreamedAnswer, events, sse
from morphguard.proxy.upstream import HOP_HEADERS, Upstream
from morphguard.telemetry import names
from morphguard.telemetry import setup as telemetry_setup
from morphguard.telemetry.server import ServerSpans

log = logging.getLogger(__name__)


class Proxy:
    def __init__(self, config: Config, detector: Detector | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.config = config
        self.settings = config.proxy
        self.extractor = ContextExtractor(self.settings.context)
        self.engine = PolicyEngine(config.policy)
        self._detector = detector
        self._transport = transport
        self.upstream: Upstream
        self.guard: Guard

    @asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        telemetry_setup.configure(self.config.telemetry)
        detector = self._detector or await asyncio.to_thread(build_detector, self.config)  # may start the judge
        self.upstream = Upstream(self.settings, self._transport)
        self.adapter = LitellmAdapter(self.settings.litellm_routes, self.settings.upstream.timeout_s)
        policy = self.config.policy
        audit = AuditStore(policy.audit) if policy.audit.enabled else None
        self.guard = Guard(detector, self.engine, self.config, audit, Escalator(policy.escalation, audit))
        self.guard.start()
        try:
            yield
        finally:
            await self.guard.stop()
            await self.upstream.aclose()
            if audit is not None:
                audit.close()
            telemetry_setup.shutdown()

    def app(self) -> ServerSpans:
        return ServerSpans(Starlette(
            routes=[
                Route("/healthz", self.healthz, methods=["GET"]),
                Route("/readyz", self.readyz, methods=["GET"]),
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/{path:path}", self.forward, methods=["GET", "POST", "PUT", "PATCH", "DELETE"]),
                # A path prefix (base_url http://proxy/clinic/v1) can select a policy profile.
                Route("/{prefix:path}/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/{prefix:path}/v1/{path:path}", self.forward, methods=["GET", "POST", "PUT", "PATCH", "DELETE"]),
            ],
            exception_handlers={ProxyError: handle_proxy_error, Exception: handle_unexpected},
            lifespan=self.lifespan,
        ))

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        checks = {"upstream": await self._reachable(self.upstream.client, "models")}
        llm = getattr(self.guard.detector, "llm", None)
        local = getattr(llm, "routes", {}).get("local")
        if local is not None and local.api_base:
            async with httpx.AsyncClient(timeout=3.0) as client:
                checks["judge"] = await self._reachable(client, local.api_base.removesuffix("/v1") + "/health")
        ready = all(checks.values())
        return JSONResponse({"status": "ready" if ready else "not_ready", "checks": checks},
                            status_code=200 if ready else 503)

    @staticmethod
    async def _reachable(client: httpx.AsyncClient, url: str) -> bool:
        try:
            return (await client.get(url, timeout=3.0)).status_code < 500
        except httpx.HTTPError:
            return False

    async def _read_body(self, request: Request) -> bytes:
        limit = self.settings.max_body_bytes
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise too_large(limit)
        body = bytearray()
        async for part in request.stream():
            body += part
            if len(body) > limit:
                raise too_large(limit)
        return bytes(body)

    def _review(self, request: Request, extraction: Extraction) -> Review:
        options = extraction.options
        headers = {k.lower(): val for k, val in request.headers.items()}
        prefix = request.path_params.get("prefix")
        facts = RequestFacts(
            api_key=headers.get("authorization", "").removeprefix("Bearer ").strip() or None,
            model=extraction.body.get("model") if isinstance(extraction.body.get("model"), str) else None,
            headers=headers, path_prefix=f"/{prefix}" if prefix else "",
            requested_profile=options.get("policy") or headers.get("x-morphguard-policy"),
            requested_topic=options.get("topic") or headers.get("x-morphguard-topic"),
        )
        profile = self.engine.profile_for(facts)
        topic = self.engine.topic_for(profile, extraction.rag, facts.requested_topic)
        return Review(body=extraction.body, rag=extraction.rag, source=extraction.source, profile=profile,
                      topic=topic, model=facts.model, route=facts.path_prefix, detector=options.get("detector"))

    async def _complete(self, body: dict[str, Any], headers: dict[str, str], route: LitellmRoute | None
                        ) -> tuple[dict[str, Any] | Response, Span, int]:
        """One non-streamed completion (or the provider's own error response, unchanged), its GenAI span
        (left open for the evaluation event; the caller ends it) and when the upstream answered."""
        model = body.get("model") if isinstance(body.get("model"), str) else None
        provider = self._provider(route)
        span = telemetry.start_chat_span(model, provider, "upstream", body.get("messages"))
        started = time.perf_counter()
        try:
            with trace.use_span(span, end_on_exit=False, record_exception=True):
                result = await self._complete_once(body, headers, route)
        except BaseException:
            span.end()
            raise
        answered = time.time_ns()
        if isinstance(result, Response):
            telemetry.record_chat(span, provider=provider, role="upstream", request_model=model, response_model=None,
                                  input_tokens=None, output_tokens=None, seconds=time.perf_counter() - started,
                                  error=f"HTTP {result.status_code}")
        else:
            usage = result.get("usage") if isinstance(result.get("usage"), dict) else {}
            telemetry.record_chat(
                span, provider=provider, role="upstream", request_model=model, response_model=result.get("model"),
                input_tokens=usage.get("prompt_tokens"), output_tokens=usage.get("completion_tokens"),
                finish_reasons=[str(c.get("finish_reason")) for c in result.get("choices", []) if isinstance(c, dict)],
                seconds=time.perf_counter() - started, output_text=answer_of(result))
        return result, span, answered

    def _provider(self, route: LitellmRoute | None) -> str:
        return route.prefix.split("/")[0] if route else self.config.telemetry.upstream_provider

    async def _complete_once(self, body: dict[str, Any], headers: dict[str, str], route: LitellmRoute | None
                             ) -> dict[str, Any] | Response:
        if route is not None:
            return await self.adapter.complete(route, body)
        async with self.upstream.open("POST", "chat/completions", headers, json.dumps(body).encode()) as response:
            data = await response.aread()
        if response.status_code >= 400:
            return Response(data, response.status_code, media_type=response.headers.get("content-type"))
        try:
            completion = json.loads(data)
            completion["choices"][0]["message"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise upstream_unavailable("the response is not a chat completion") from None
        return completion

    def _reask(self, headers: dict[str, str], route: LitellmRoute | None) -> Reask:
        async def reask(body: dict[str, Any]) -> dict[str, Any]:
            completion, span, answered = await self._complete(body, headers, route)
            span.end(end_time=answered)
            if isinstance(completion, Response):
                raise upstream_unavailable(f"HTTP {completion.status_code} on regeneration")
            return completion

        return reask

    async def chat(self, request: Request) -> Response:
        body = _parse_chat(await self._read_body(request))
        headers = self.upstream.headers_for(request.headers)
        headers["content-type"] = "application/json"
        extraction = self.extractor.extract(body)
        review = self._review(request, extraction)
        route = self.adapter.route_for(body.get("model"))
        if body.get("stream"):
            return await self._chat_stream(headers, extraction, review, route)

        completion, span, answered = await self._complete(extraction.body, headers, route)
        try:
            if isinstance(completion, Response):  # the provider's own error, unchanged
                return completion
            review.chat_span = span
            span.set_attribute(names.REQUEST_ID, review.request_id)
            verdict = None
            if self.settings.mode == "async":
                verdict = self.guard.check_later(review, completion)
            if verdict is None:
                with trace.use_span(span, end_on_exit=False):
                    completion, verdict = await self.guard.review(review, completion,
                                                                  reask=self._reask(headers, route))
        finally:
            span.end(end_time=answered)  # the span measures the upstream call, not our check
        completion[OUR_FIELD] = verdict
        return JSONResponse(completion, headers=v.headers(verdict))

    async def _chat_stream(self, headers: dict[str, str], extraction: Extraction, review: Review,
                           route: LitellmRoute | None) -> Response:
        model = extraction.body.get("model") if isinstance(extraction.body.get("model"), str) else None
        provider = self._provider(route)
        span = telemetry.start_chat_span(model, provider, "upstream", extraction.body.get("messages"))
        span.set_attribute(names.REQUEST_ID, review.request_id)
        review.chat_span = span
        started = time.perf_counter()
        try:
            with trace.use_span(span, end_on_exit=False, record_exception=True):
                if route is not None:
                    source: AsyncIterator[str] = self.adapter.stream(route, extraction.body)
                    close = _nothing
                else:
                    opened = self.upstream.open("POST", "chat/completions", headers,
                                                json.dumps(extraction.body).encode())
                    response = await opened.__aenter__()
                    if response.status_code >= 400:
                        data = await response.aread()
                        await opened.__aexit__(None, None, None)
                        span.end()
                        return Response(data, response.status_code, media_type=response.headers.get("content-type"))
                    source = events(response.aiter_lines())

                    async def close() -> None:
                        await opened.__aexit__(None, None, None)
        except BaseException:
            span.end()
            raise

        answer = StreamedAnswer()
        mode = self.settings.stream_mode

        def answered() -> int:
            telemetry.record_chat(span, provider=provider, role="upstream", request_model=model,
                                  response_model=answer.model or None, input_tokens=None, output_tokens=None,
                                  finish_reasons=[answer.finish_reason] if answer.finish_reason else [],
                                  seconds=time.perf_counter() - started, output_text=answer.text)
            return time.time_ns()

        if mode == "buffer":  # collect everything, review, then send: the only stream mode that can change the answer
            try:
                payloads = [p async for p in _chunks(source, answer)]
            finally:
                await close()
            ended = answered()
            try:
                with trace.use_span(span, end_on_exit=False):
                    reviewed, verdict = await self.guard.review(review, answer.as_completion(),
                                                                reask=self._reask(headers, route))
            finally:
                span.end(end_time=ended)
            text = answer_of(reviewed)
            if text != answer.text:
                finish = reviewed["choices"][0].get("finish_reason") or "stop"
                out = [sse(c) for c in answer.replacement_chunks(text, finish)]
            else:
                out = [b"data: " + p.encode() + b"\n\n" for p in payloads]
            out += [sse(answer.verdict_chunk(verdict)), DONE]
            return StreamingResponse(iter(out), media_type="text/event-stream", headers=v.headers(verdict))

        async def relay() -> AsyncIterator[bytes]:
            ended = None
            try:
                try:
                    async for payload in _chunks(source, answer):
                        yield b"data: " + payload.encode() + b"\n\n"
                finally:
                    await close()
                ended = answered()
                verdict = self.guard.check_later(review, answer.as_completion()) if mode == "async" else None
                if verdict is None:
                    with trace.use_span(span, end_on_exit=False):
                        _, verdict = await self.guard.review(review, answer.as_completion(), can_change=False)
            finally:
                span.end(end_time=ended)
            yield sse(answer.verdict_chunk(verdict))
            yield DONE

        return StreamingResponse(relay(), media_type="text/event-stream")

    async def forward(self, request: Request) -> Response:
        """Any other /v1 path: bytes through, status and headers kept, streaming included."""
        body = await self._read_body(request)
        headers = self.upstream.headers_for(request.headers)
        path = request.path_params["path"]
        opened: AbstractAsyncContextManager[httpx.Response] = self.upstream.open(
            request.method, path, headers, body or None, params=request.query_params)
        response = await opened.__aenter__()

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for part in response.aiter_raw():
                    yield part
            finally:
                await opened.__aexit__(None, None, None)

        kept = {k: val for k, val in response.headers.items() if k.lower() not in HOP_HEADERS}
        return StreamingResponse(relay(), status_code=response.status_code, headers=kept)


async def _nothing() -> None:
    return None


async def _chunks(source: AsyncIterator[str], answer: StreamedAnswer) -> AsyncIterator[str]:
    """The chunk payloads up to [DONE], each also added to `answer`."""
    async for payload in source:
        if payload.strip() == "[DONE]":
            break
        try:
            answer.add(json.loads(payload))
        except ValueError:
            log.warning("unreadable stream chunk passed through")
        yield payload


def _parse_chat(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except ValueError:
        raise bad_request("The request body is not valid JSON.") from None
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    messages = body.get("messages")
    if messages is None:
        raise bad_request("Missing required parameter: 'messages'.", "messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty array.", "messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise bad_request(f"messages[{i}] must be an object with a string 'role'.", f"messages[{i}]")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise bad_request("'stream' must be a boolean.", "stream")
    ours = body.get(OUR_FIELD)
    if ours is not None:
        if not isinstance(ours, dict):
            raise bad_request(f"'{OUR_FIELD}' must be an object.", OUR_FIELD)
        if ours.get("detector") is not None and not is_known(ours["detector"]):
            raise bad_request(f"'{OUR_FIELD}.detector' must be one of: {', '.join(sorted(DETECTORS))} "
                              f"(or metarag:PROFILE).", f"{OUR_FIELD}.detector")
        context = ours.get("context")
        if context is not None and not (isinstance(context, str) or (
                isinstance(context, list) and all(isinstance(p, str) for p in context))):
            raise bad_request(f"'{OUR_FIELD}.context' must be a string or an array of strings.",
                              f"{OUR_FIELD}.context")
    return body


def create_app(config: Config, detector: Detector | None = None) -> ServerSpans:
    return Proxy(config, detector).app()
