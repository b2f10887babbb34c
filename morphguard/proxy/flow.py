"""The one request path of every checked API: read → extract → forward → check → decide → act → audit.

A dialect (`proxy.dialects`) says what its API looks like; everything else happens here, the same way for
each: the body read within `max_body_bytes` and parsed (off the loop when big), the request read as a chat for
context extraction, profile and topic chosen, the provider called through the one `Backend`, the answer
settled by the guard (checked, decided by policy once, carried out, audited) and written back with its verdict.
A stream goes to the mode `proxy.stream_mode` chooses for the request (`proxy.stream_modes`), which runs the steps
this path offers it (`proxy.exchange.Steps`). From the moment a request is accepted, every way out leaves one
audit row. A client that leaves before its plain answer is ready cancels the work on it, the provider's call with it
(a stream is cancelled by the server when its client leaves).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import AsyncIterator, Coroutine, Mapping
from contextlib import AsyncExitStack, asynccontextmanager, nullcontext, suppress
from typing import Any

from opentelemetry import trace
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from morphguard.config import Config
from morphguard.fairness import client_id
from morphguard.policy.answers import prose
from morphguard.policy.engine import PolicyEngine, Reach, RequestFacts
from morphguard.proxy.backend import Backend, Call
from morphguard.proxy.body import OFFLOAD_BYTES, str_or_none
from morphguard.proxy.context import OUR_FIELD, ContextExtractor, Extraction
from morphguard.proxy.credentials import presented_key
from morphguard.proxy.dialects.base import Dialect
from morphguard.proxy.errors import (
    JSON,
    ProxyError,
    bad_request,
    client_disconnected,
    client_left,
    too_large,
    upstream_unavailable,
)
from morphguard.proxy.exchange import Exchange, StreamMode
from morphguard.proxy.stream_modes import STREAM_MODES, stream_mode
from morphguard.settle.guard import Guard
from morphguard.settle.stream_checks import Streaming
from morphguard.settle.values import Answer, CheckRequest, Reask, Settled
from morphguard.telemetry import names

log = logging.getLogger(__name__)


class Flow:
    """The request path; to a stream mode, its `Steps` (`proxy.exchange`)."""

    def __init__(self, config: Config, engine: PolicyEngine, backend: Backend, guard: Guard,
                 stream_modes: Mapping[str, StreamMode] = STREAM_MODES) -> None:
        self.config = config
        self.settings = config.proxy
        self.extractor = ContextExtractor(self.settings.context)
        self.engine = engine
        self.backend = backend
        self.guard = guard
        self.stream_modes = stream_modes

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
            return await _unless_client_leaves(request, self._complete(exchange))

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
                              policy=extraction.options.get("policy"), topic=extraction.options.get("topic"),
                              address=address_of(request))
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
        async with self.backend.complete(exchange.dialect, exchange.body, exchange.headers,
                                         exchange.view["messages"]) as reply:
            if reply.response is None:  # the provider's own error, unchanged
                assert reply.refused is not None
                await self.guard.account(exchange.intake, f"upstream_http_{reply.refused.status_code}")
                return reply.refused
            self._calls(exchange, reply)
            answer = Answer(exchange.dialect.completion(reply.response), reply.response)
            if self.settings.mode == "async":
                settled = await self.check_later(exchange, answer, Reach.REWRITE)
            else:
                settled = await self.check(exchange, answer, Reach.REWRITE)
        assert settled.answer.response is not None
        return JSON({**settled.answer.response, OUR_FIELD: settled.record.payload()},
                    headers=reply.kept | settled.record.headers())

    async def _stream(self, exchange: Exchange) -> Response:
        """The stream in the mode chosen for it. The provider's stream and its span are opened here and ended here,
        in a `finally`, however the response ends (sent, its client gone before or while it was sent, an error
        before it was made); a mode may end them earlier, the moment the provider has finished."""
        opened = AsyncExitStack()
        try:
            relay = await opened.enter_async_context(self.backend.stream(exchange.dialect, exchange.body,
                                                                         exchange.headers, exchange.view["messages"]))
            if relay.events is None:
                await opened.aclose()
                assert relay.refused is not None
                await self.guard.account(exchange.intake, f"upstream_http_{relay.refused.status_code}")
                return relay.refused
            self._calls(exchange, relay)
            intake = exchange.intake
            name = stream_mode(self.settings, self.engine.strongest(intake.profile, intake.topic), intake,
                               tool_calls_checked=self.config.policy.tool_calls == "check")
            response = await self.stream_modes[name].respond(self, exchange, relay, opened)
            return _Holding(response, opened.pop_all())  # ended once the response is sent, or abandoned
        finally:
            await opened.aclose()

    @staticmethod
    def _calls(exchange: Exchange, call: Call) -> None:
        """The provider call's span is the one the check's evaluation goes on."""
        exchange.intake.chat_span = call.span
        call.span.set_attribute(names.REQUEST_ID, exchange.intake.request_id)

    # --- the steps a stream mode runs (`proxy.exchange.Steps`) -------------------------------------------------

    def answered(self, exchange: Exchange, call: Call, answer: Answer) -> None:
        self.backend.record(exchange.dialect, call, answer.response, prose(answer.completion))

    async def check(self, exchange: Exchange, answer: Answer, reach: Reach) -> Settled:
        reask = None
        if reach is Reach.REWRITE and exchange.dialect.can_reask:
            reach, reask = Reach.ASK_AGAIN, self._reask(exchange)
        span = exchange.intake.chat_span
        with trace.use_span(span, end_on_exit=False) if span is not None else nullcontext():
            settled = await self.guard.settle(exchange.intake, answer, reach, reask=reask)
        if reach is Reach.NONE or answer.response is None:
            return Settled(answer, settled.record)
        written = exchange.dialect.written(answer.response, settled.answer.completion, settled.record.action == "block")
        return Settled(Answer(settled.answer.completion, written), settled.record)

    async def check_later(self, exchange: Exchange, answer: Answer, reach: Reach) -> Settled:
        record = await self.guard.check_later(exchange.intake, answer)
        if record is not None:
            return Settled(answer, record)
        return await self.check(exchange, answer, reach)

    def stream(self, exchange: Exchange) -> Streaming:
        return self.guard.stream(exchange.intake)

    def _reask(self, exchange: Exchange) -> Reask:
        async def reask(body: dict[str, Any]) -> dict[str, Any]:
            async with self.backend.complete(exchange.dialect, body, exchange.headers) as reply:
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
                        client=client_id(asking(config, facts)))


def asking(config: Config, facts: RequestFacts) -> str:
    """Who is asking, for fair turns at the judge: the proxy key the request authenticated with (`proxy.keys`), else
    the address it came from and the route it took. A key the proxy does not know names no one (an upstream that
    takes any key lets a client present a new one with every request, or everyone the same placeholder). A request
    handed over in process (the LiteLLM guardrail: no address) is named by its key, which its host authenticated."""
    key = facts.api_key
    if key and any(hmac.compare_digest(key.encode(), k.get_secret_value().encode()) for k in config.proxy.keys):
        return f"key {key}"
    if facts.address is None:
        return f"key {key}" if key else ""
    return f"from {facts.address} {facts.path_prefix}"


def request_facts(headers: Mapping[str, str], *, prefix: str = "", model: str | None = None, policy: Any = None,
                  topic: Any = None, address: str | None = None) -> RequestFacts:
    """What policy routes on: the key, model, headers and path prefix, and the profile or topic asked for (in our
    body field, else in a header); `address`: where the request came from."""
    lower = {k.lower(): val for k, val in headers.items()}
    return RequestFacts(api_key=presented_key(lower), model=model, headers=lower, path_prefix=prefix,
                        requested_profile=str_or_none(policy) or lower.get("x-morphguard-policy"),
                        requested_topic=str_or_none(topic) or lower.get("x-morphguard-topic"), address=address)


def address_of(request: Request) -> str:
    """The address a request came from, as uvicorn gives it (behind a reverse proxy it trusts, the one that proxy
    forwards); "" where none is known."""
    return request.client.host if request.client else ""


async def _unless_client_leaves(request: Request, work: Coroutine[Any, Any, Response]) -> Response:
    """`work`'s response; cancelled if the client leaves first (a 499 nobody reads, whose row `accepted` writes).
    The body is read whole by now: the next message the server has for us is the client's leaving."""
    answer = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_left(request))
    try:
        await asyncio.wait((answer, gone), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        answer.cancel()
        raise
    finally:
        gone.cancel()
    if answer.done():
        return answer.result()
    answer.cancel()
    with suppress(asyncio.CancelledError, Exception):  # what it was doing ends with it: the client is gone
        await answer
    raise client_left()


class _Holding(Response):
    """A stream's response holding the provider's stream open while it is sent, and ending it however the sending
    ends (the whole stream sent, the client gone, an error)."""

    def __init__(self, response: Response, opened: AsyncExitStack) -> None:
        self.response, self.opened = response, opened
        self.status_code, self.raw_headers, self.background = response.status_code, response.raw_headers, None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.response(scope, receive, send)
        finally:
            await self.opened.aclose()


async def _left(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _prefix(request: Request) -> str:
    """The path prefix a route was reached under (`/clinic` of /clinic/v1/chat/completions), or none."""
    prefix = request.path_params.get("prefix")
    return f"/{prefix}" if prefix else ""

