"""The one request path of every checked API: read → extract → forward → check → decide → act → audit.

A dialect (`proxy.dialects`) says what its API looks like; everything else happens here, the same way for
each: the body read within `max_body_bytes` and parsed (off the loop when big), the request read as a chat for
context extraction, profile and topic chosen, the provider called through the one `Backend`, the answer
checked by the guard and written back with its verdict. A stream goes to the mode `proxy.stream_mode` names
(`proxy.stream_modes`). From the moment a request is accepted, every way out leaves one audit row.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from opentelemetry import trace
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from morphguard.config import Config
from morphguard.llm.fair import client_id
from morphguard.policy.engine import PolicyEngine, RequestFacts
from morphguard.policy.record import DecisionRecord
from morphguard.proxy.backend import Backend, Call
from morphguard.proxy.body import OFFLOAD_BYTES, str_or_none
from morphguard.proxy.check import CheckRequest
from morphguard.proxy.context import OUR_FIELD, ContextExtractor, Extraction
from morphguard.proxy.credentials import presented_key
from morphguard.proxy.dialects.base import Dialect
from morphguard.proxy.errors import JSON, ProxyError, bad_request, client_disconnected, too_large, upstream_unavailable
from morphguard.proxy.exchange import Exchange, StreamMode
from morphguard.proxy.guard import Guard, Reask
from morphguard.proxy.stream_modes import STREAM_MODES
from morphguard.telemetry import names

log = logging.getLogger(__name__)


class Flow:
    def __init__(self, config: Config, engine: PolicyEngine, backend: Backend, guard: Guard,
                 stream_modes: dict[str, StreamMode] = STREAM_MODES) -> None:
        self.config = config
        self.settings = config.proxy
        self.extractor = ContextExtractor(self.settings.context)
        self.engine = engine
        self.backend = backend
        self.guard = guard
        self.stream_mode = stream_modes[self.settings.stream_mode]

    async def handle(self, request: Request, dialect: Dialect) -> Response:
        headers = self.backend.headers_for(dialect, request.headers)
        raw = await self.read_body(request)
        if len(raw) > OFFLOAD_BYTES:
            exchange = await asyncio.to_thread(self._accept, request, dialect, raw, headers)
        else:
            exchange = self._accept(request, dialect, raw, headers)
        async with self.accepted(exchange.intake, "upstream_error"):
            if exchange.body.get("stream"):
                return await self._stream(exchange)
            return await self._complete(exchange)

    @asynccontextmanager
    async def accepted(self, intake: CheckRequest, reason: str) -> AsyncIterator[None]:
        """The request is accepted: a way out by an error leaves its audit row too, with the error's code (else
        `reason`)."""
        try:
            yield
        except ProxyError as exc:
            await self.guard.account(intake, exc.code or reason)
            raise
        except Exception:  # a bug of ours: the client gets a 500, the audit trail still gets its row
            await self.guard.account(intake, "internal_error")
            raise

    async def settle(self, intake: CheckRequest,
                     completion: dict[str, Any]) -> tuple[dict[str, Any], DecisionRecord]:
        """An answer the caller already has (`/v1/check`), checked inline whatever `proxy.mode` says, since the
        caller waits for the verdict; accepted, so every way out leaves one audit row."""
        async with self.accepted(intake, "check_error"):
            return await self.guard.settle(intake, completion)

    async def read_body(self, request: Request) -> bytes:
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

    def _accept(self, request: Request, dialect: Dialect, raw: bytes, headers: dict[str, str]) -> Exchange:
        """Parse, read as a chat, extract the context, choose profile and topic: CPU work, off the loop when big."""
        body = dialect.read(raw)
        view = dialect.chat_view(body)
        extraction = self.extractor.extract(view)
        facts = request_facts(request.headers, prefix=_prefix(request), model=str_or_none(view.get("model")),
                              policy=extraction.options.get("policy"), topic=extraction.options.get("topic"))
        intake = accept(self.engine, self.config, extraction, facts)
        forwarded = {k: v for k, v in body.items() if k != OUR_FIELD}
        return Exchange(dialect, forwarded, view, intake, headers)

    def bare_intake(self, request: Request) -> CheckRequest:
        """The request as policy sees it when there is no body to read (an unchecked route)."""
        full = request_facts(request.headers, prefix=_prefix(request))
        facts = RequestFacts(api_key=full.api_key, headers=full.headers, path_prefix=full.path_prefix)
        profile = self.engine.profile_for(facts)
        return CheckRequest(body={}, rag=None, source=None, profile=profile,
                            topic=self.engine.topic_for(profile, None), route=facts.path_prefix)

    async def _complete(self, exchange: Exchange) -> Response:
        reply = await self.backend.complete(exchange.dialect, exchange.body, exchange.headers,
                                            exchange.view["messages"])
        try:
            if reply.response is None:  # the provider's own error, unchanged
                assert reply.refused is not None
                await self.guard.account(exchange.intake, f"upstream_http_{reply.refused.status_code}")
                return reply.refused
            self._calls(exchange, reply)
            response, record = await self.check(
                exchange, reply, reply.response, exchange.dialect.completion(reply.response), can_change=True,
                later=self.settings.mode == "async")
        finally:
            reply.end()  # the span measures the upstream call, not our check
        assert response is not None
        return JSON({**response, OUR_FIELD: record.payload()}, headers=reply.kept | record.headers())

    async def _stream(self, exchange: Exchange) -> Response:
        opened = AsyncExitStack()  # holds the provider's stream open until the response is done with it
        relay = await opened.enter_async_context(self.backend.stream(exchange.dialect, exchange.body,
                                                                     exchange.headers, exchange.view["messages"]))
        if relay.events is None:
            await opened.aclose()
            assert relay.refused is not None
            await self.guard.account(exchange.intake, f"upstream_http_{relay.refused.status_code}")
            return relay.refused
        self._calls(exchange, relay)
        return await self.stream_mode.respond(self, exchange, relay, opened)

    @staticmethod
    def _calls(exchange: Exchange, call: Call) -> None:
        """The provider call's span is the one the check's evaluation goes on."""
        exchange.intake.chat_span = call.span
        call.span.set_attribute(names.REQUEST_ID, exchange.intake.request_id)

    async def check(self, exchange: Exchange, call: Call, response: dict[str, Any] | None,
                    completion: dict[str, Any], *, can_change: bool,
                    later: bool) -> tuple[dict[str, Any] | None, DecisionRecord]:
        record = await self.guard.check_later(exchange.intake, completion) if later else None
        if record is not None:
            return response, record
        reask = self._reask(exchange) if exchange.dialect.can_reask else None
        with trace.use_span(call.span, end_on_exit=False):
            checked, record = await self.guard.settle(exchange.intake, completion, can_change=can_change,
                                                      reask=reask)
        if not can_change or response is None:
            return response, record
        return exchange.dialect.written(response, checked, record.action == "block"), record

    def _reask(self, exchange: Exchange) -> Reask:
        async def reask(body: dict[str, Any]) -> dict[str, Any]:
            reply = await self.backend.complete(exchange.dialect, body, exchange.headers)
            reply.end()
            if reply.response is None:
                status = reply.refused.status_code if reply.refused is not None else "none"
                raise upstream_unavailable(f"HTTP {status} on regeneration")
            return exchange.dialect.completion(reply.response)

        return reask


def accept(engine: PolicyEngine, config: Config, extraction: Extraction, facts: RequestFacts) -> CheckRequest:
    """The request as policy sees it, the same however it came in (an API's route, `/v1/check`, the LiteLLM
    guardrail): profile by the route rules, topic by the tagger over the conversation and context, and the detector
    the request names where `policy.request_override` lets requests choose (400 otherwise)."""
    detector = extraction.options.get("detector")
    if detector is not None and not config.policy.request_override:
        raise bad_request(f"'{OUR_FIELD}.detector' may only be set when the proxy allows requests to choose "
                          "their policy (policy.request_override).", f"{OUR_FIELD}.detector")
    profile = engine.profile_for(facts)
    topic = engine.topic_for(profile, extraction.rag, facts.requested_topic)
    return CheckRequest(body=extraction.body, rag=extraction.rag, source=extraction.source, profile=profile,
                        topic=topic, model=facts.model, route=facts.path_prefix, detector=detector,
                        client=client_id(facts.api_key))


def request_facts(headers: Mapping[str, str], *, prefix: str = "", model: str | None = None, policy: Any = None,
                  topic: Any = None) -> RequestFacts:
    """What policy routes on: the key, model, headers and path prefix, and the profile or topic asked for (in our
    body field, else in a header)."""
    lower = {k.lower(): val for k, val in headers.items()}
    return RequestFacts(api_key=presented_key(lower), model=model, headers=lower, path_prefix=prefix,
                        requested_profile=str_or_none(policy) or lower.get("x-morphguard-policy"),
                        requested_topic=str_or_none(topic) or lower.get("x-morphguard-topic"))


def _prefix(request: Request) -> str:
    """The path prefix a route was reached under (`/clinic` of /clinic/v1/chat/completions), or none."""
    prefix = request.path_params.get("prefix")
    return f"/{prefix}" if prefix else ""

