"""morphguard as a guardrail of the LiteLLM proxy, running the whole guard in the proxy's own process.

LiteLLM loads `MorphguardGuardrail` from its config (`guardrails:` → `litellm_params.guardrail:
morphguard.integrations.litellm.MorphguardGuardrail`) and calls it at the points its `mode` names:

- `pre_call`: the chat request is read as morphguard's proxy reads it (context from the `morphguard` field, tool
  messages or tags; profile by route rules and hints; topic), and the `morphguard` field is taken out before the
  request goes to the provider. A malformed request is refused with an OpenAI-shaped 400.
- `during_call`: the same reading, while the provider is already answering (it cannot take the field out).
- `post_call`: the answer is checked, policy decides, the action is carried out, the decision audited and
  escalated. `block` rejects the response the way LiteLLM's guardrails do (HTTP 400, the decision in the
  error); other actions return the response rewritten as the action says, with the decision as its `morphguard`
  field and the `x-morphguard-*` headers. A stream is collected whole, checked, then sent.

Checks need the answer, so `post_call` is the mode that checks; a request seen in `pre_call` or `during_call`
that never gets an answer (the provider failed) is audited as not checked with the reason `upstream_error`.
The guard is built from a morphguard config file (`morphguard_config`, else the `MORPHGUARD_CONFIG`
environment variable, else the defaults) when LiteLLM loads the class, and started on the first request.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from collections import OrderedDict
from collections.abc import AsyncGenerator
from typing import Any

import litellm
from fastapi import HTTPException
from litellm.integrations.custom_guardrail import CustomGuardrail
from litellm.types.guardrails import GuardrailEventHooks

from morphguard.config import Config, load_config
from morphguard.detectors import build_detector
from morphguard.detectors.judges import require_judges
from morphguard.masking import mask_config_secrets
from morphguard.policy.answers import prose
from morphguard.policy.engine import PolicyEngine
from morphguard.policy.record import DecisionRecord
from morphguard.proxy.body import parse_chat, str_or_none
from morphguard.proxy.check import CheckRequest
from morphguard.proxy.consumer import Consumer
from morphguard.proxy.context import OUR_FIELD, ContextExtractor
from morphguard.proxy.errors import ProxyError, json_bytes
from morphguard.proxy.flow import accept, request_facts
from morphguard.proxy.guard import Guard, build_guard
from morphguard.telemetry import setup as telemetry_setup

log = logging.getLogger(__name__)

_CHAT_CALLS = frozenset({"completion", "acompletion"})
_STATE = "morphguard_request"  # the key, in LiteLLM's request metadata, of this guardrail's state for the request
_MAX_PENDING = 10_000  # requests read before the call and not yet answered; the oldest are forgotten past this


class MorphguardGuardrail(CustomGuardrail):
    def __init__(self, morphguard_config: str | None = None, **kwargs: Any) -> None:
        hooks = [GuardrailEventHooks.pre_call, GuardrailEventHooks.during_call, GuardrailEventHooks.post_call]
        super().__init__(supported_event_hooks=hooks, **kwargs)
        path = morphguard_config or os.environ.get("MORPHGUARD_CONFIG")
        self.config: Config = load_config(path)
        mask_config_secrets(self.config)
        telemetry_setup.configure(self.config.telemetry)
        self.engine = PolicyEngine(self.config.policy)
        self.extractor = ContextExtractor(self.config.proxy.context)
        self._detector = build_detector(self.config)  # may start the embedded judge
        self._guard: Guard | None = None
        self._consumer: Consumer | None = None  # of the async check queue, for `proxy.mode: async` elsewhere
        self._starting = asyncio.Lock()
        self._pending: OrderedDict[str, CheckRequest] = OrderedDict()
        self._headers: OrderedDict[str, dict[str, str]] = OrderedDict()

    async def guard(self) -> Guard:
        """The guard on the configured stores, started on the event loop of the first request."""
        if self._guard is None:
            async with self._starting:
                if self._guard is None:
                    await require_judges(self.config, getattr(self._detector, "llm", None))
                    guard = await asyncio.to_thread(build_guard, self.config, self._detector, self.engine)
                    self._consumer = Consumer(guard)
                    await self._consumer.start()
                    self._guard = guard
        return self._guard

    # --- the request ----------------------------------------------------------------------------------------

    def _intake(self, data: dict[str, Any], *, strip: bool) -> CheckRequest:
        """The chat request as policy sees it; a 400 for what morphguard's proxy would refuse."""
        chat = {k: data[k] for k in ("model", "messages", "stream", OUR_FIELD) if data.get(k) is not None}
        try:
            extraction = self.extractor.extract(parse_chat(json_bytes(chat)))
            facts = request_facts(_client_headers(data), model=str_or_none(data.get("model")),
                                  policy=extraction.options.get("policy"), topic=extraction.options.get("topic"))
            request = accept(self.engine, self.config, extraction, facts)
        except ProxyError as exc:
            raise _rejection(exc.status, exc.payload()["error"]) from None
        if strip:
            data.pop(OUR_FIELD, None)
        return request

    def _remember(self, data: dict[str, Any], request: CheckRequest) -> None:
        metadata = data.setdefault("metadata", {})
        if not isinstance(metadata, dict):
            return
        token = uuid.uuid4().hex  # ours, not the client's call id: a client cannot point at another's state
        metadata[_STATE] = token
        self._pending[token] = request
        while len(self._pending) > _MAX_PENDING:
            self._pending.popitem(last=False)

    def _recall(self, data: dict[str, Any], *, keep: bool = False) -> CheckRequest | None:
        metadata = data.get("metadata")
        token = metadata.get(_STATE) if isinstance(metadata, dict) else None
        if not isinstance(token, str):
            return None
        return self._pending.get(token) if keep else self._pending.pop(token, None)

    async def async_pre_call_hook(self, user_api_key_dict: Any, cache: Any, data: dict[str, Any],
                                  call_type: Any) -> dict[str, Any]:
        if call_type in _CHAT_CALLS:
            self._remember(data, self._intake(data, strip=True))
        return data

    async def async_moderation_hook(self, data: dict[str, Any], user_api_key_dict: Any, call_type: Any) -> None:
        if call_type in _CHAT_CALLS and self._recall(data, keep=True) is None:  # pre_call may have read it already
            self._remember(data, self._intake(data, strip=False))

    # --- the answer -------------------------------------------------------------------------------------------

    async def _review(self, data: dict[str, Any], completion: dict[str, Any]) -> tuple[dict[str, Any], DecisionRecord]:
        request = self._recall(data) or self._intake(data, strip=False)
        guard = await self.guard()
        try:
            reviewed, record = await guard.settle(request, completion)
        except Exception:
            await guard.account(request, "internal_error")
            raise
        if record.action == "block":
            payload = record.payload()
            raise _rejection(400, {"message": prose(reviewed), "type": "invalid_request_error", "param": None,
                                   "code": "morphguard_blocked"}, payload)
        return reviewed, record

    async def async_post_call_success_hook(self, data: dict[str, Any], user_api_key_dict: Any, response: Any) -> Any:
        if not isinstance(response, litellm.ModelResponse):
            return response  # not a chat answer: nothing to check
        reviewed, record = await self._review(data, response.model_dump())
        self._headers[str(data.get("litellm_call_id"))] = record.headers()  # a stream's headers are sent already
        while len(self._headers) > _MAX_PENDING:
            self._headers.popitem(last=False)
        for choice, changed in zip(response.choices, reviewed.get("choices") or [], strict=False):
            message = getattr(choice, "message", None)
            content = (changed.get("message") or {}).get("content") if isinstance(changed, dict) else None
            if message is not None and isinstance(content, str):
                message.content = content
        setattr(response, OUR_FIELD, record.payload())
        return response

    async def async_post_call_streaming_iterator_hook(self, user_api_key_dict: Any, response: Any,
                                                      request_data: dict[str, Any]) -> AsyncGenerator[Any, None]:
        chunks = [chunk async for chunk in response]
        built = litellm.stream_chunk_builder(chunks) if chunks else None
        if not isinstance(built, litellm.ModelResponse):
            for chunk in chunks:
                yield chunk
            return
        completion = built.model_dump()
        reviewed, record = await self._review(request_data, completion)
        rewritten = prose(reviewed)
        if rewritten != prose(completion):  # an action changed the text: send the text it left instead
            chunks = _replaced(chunks, rewritten)
        for chunk in chunks:
            yield chunk
        # The verdict as one more chunk with no choices, as morphguard's proxy sends it; LiteLLM relays an SSE event
        # given as bytes unchanged (its serializer of plain text chunks would drop an extra field).
        last = chunks[-1]
        verdict: dict[str, Any] = {"id": getattr(last, "id", None), "object": "chat.completion.chunk",
                                   "created": getattr(last, "created", None), "model": getattr(last, "model", None),
                                   "choices": [], OUR_FIELD: record.payload()}
        yield b"data: " + json_bytes(verdict) + b"\n\n"

    async def async_post_call_failure_hook(self, request_data: dict[str, Any], original_exception: Exception,
                                           user_api_key_dict: Any, traceback_str: str | None = None) -> None:
        request = self._recall(request_data)
        if request is not None:  # read before the call, never answered: still one audit row
            await (await self.guard()).account(request, "upstream_error")

    async def async_post_call_response_headers_hook(self, data: dict[str, Any], user_api_key_dict: Any,
                                                    response: Any, request_headers: dict[str, str] | None = None,
                                                    litellm_call_info: dict[str, object] | None = None,
                                                    ) -> dict[str, str] | None:
        return self._headers.pop(str(data.get("litellm_call_id")), None)


def _rejection(status: int, error: dict[str, Any], decision: dict[str, Any] | None = None) -> HTTPException:
    """A rejection as LiteLLM's guardrails raise it; the client gets `detail` as the error."""
    detail: dict[str, Any] = {"error": error["message"], "code": error.get("code"), "param": error.get("param")}
    if decision is not None:
        detail[OUR_FIELD] = decision
    return HTTPException(status_code=status, detail=detail)


def _replaced(chunks: list[Any], text: str) -> list[Any]:
    """The stream with its text replaced: the first content chunk carries `text`, the others none."""
    placed = False
    for chunk in chunks:
        for choice in getattr(chunk, "choices", None) or []:
            delta = getattr(choice, "delta", None)
            if delta is None or getattr(delta, "content", None) is None:
                continue
            delta.content = "" if placed else text
            placed = True
    return chunks


def _client_headers(data: dict[str, Any]) -> dict[str, str]:
    request = data.get("proxy_server_request")
    headers = request.get("headers") if isinstance(request, dict) else None
    return {str(k).lower(): str(v) for k, v in headers.items()} if isinstance(headers, dict) else {}

