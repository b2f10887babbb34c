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
import dataclasses
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
from litellm.types.llms.openai import ResponsesAPIResponse

from morphguard.config import Config, load_config
from morphguard.detectors import build_detector
from morphguard.masking import mask_config_secrets
from morphguard.policy.answers import prose
from morphguard.policy.engine import PolicyEngine
from morphguard.policy.record import DecisionRecord
from morphguard.proxy import choices
from morphguard.proxy.body import parse_chat, str_or_none
from morphguard.proxy.context import OUR_FIELD, ContextExtractor
from morphguard.proxy.dialects.messages import Messages
from morphguard.proxy.dialects.responses import Responses
from morphguard.proxy.errors import ProxyError, json_bytes
from morphguard.proxy.flow import accept, request_facts
from morphguard.settle.guard import Guard, start
from morphguard.settle.values import FAILED, CheckRequest, Verdict, label
from morphguard.telemetry import setup as telemetry_setup

log = logging.getLogger(__name__)
RESPONSES, MESSAGES = Responses(), Messages()

_CHAT_CALLS = frozenset({"completion", "acompletion"})
_TEXT_CALLS = frozenset({"text_completion", "atext_completion"})
_RESPONSES_CALLS = frozenset({"responses", "aresponses"})
_MESSAGES_CALLS = frozenset({"anthropic_messages", "aanthropic_messages"})
_CHECKED_CALLS = _CHAT_CALLS | _TEXT_CALLS | _RESPONSES_CALLS | _MESSAGES_CALLS
_STATE = "morphguard_request"  # the key, in LiteLLM's request metadata, of this guardrail's state for the request
GATEWAY = "litellm"  # as the audit rows name it (`DecisionRecord.gateway`)
_MAX_PENDING = 10_000  # requests read before the call and not yet answered; the oldest are forgotten past this


class MorphguardGuardrail(CustomGuardrail):
    def __init__(self, morphguard_config: str | None = None, **kwargs: Any) -> None:
        hooks = [GuardrailEventHooks.pre_call, GuardrailEventHooks.during_call, GuardrailEventHooks.post_call]
        super().__init__(supported_event_hooks=hooks, **kwargs)
        path = morphguard_config or os.environ.get("MORPHGUARD_CONFIG")
        self.config: Config = load_config(path)
        mask_config_secrets(self.config)
        telemetry_setup.configure(self.config.telemetry)
        self.engine = PolicyEngine(self.config.policy)  # reads requests before the guard starts
        self.extractor = ContextExtractor(self.config.proxy.context)
        self._detector = build_detector(self.config)  # the embedded judge starts with LiteLLM, not at a first request
        self._guard: Guard | None = None
        self._starting = asyncio.Lock()
        self._pending: OrderedDict[str, CheckRequest] = OrderedDict()
        self._headers: OrderedDict[str, dict[str, str]] = OrderedDict()

    async def guard(self) -> Guard:
        """The guard on the configured stores, with the consumer of the async check queue (for `proxy.mode: async`
        elsewhere), started on the event loop of the first request."""
        if self._guard is None:
            async with self._starting:
                if self._guard is None:
                    self._guard = await start(self.config, self._detector)
        return self._guard

    # --- the request ----------------------------------------------------------------------------------------

    def _intake(self, data: dict[str, Any], *, strip: bool, call_type: Any = "acompletion") -> CheckRequest:
        """The request as policy sees it, read in its API (`call_type`) as a chat; a 400 for what morphguard's proxy
        would refuse."""
        try:
            extraction = self.extractor.extract(parse_chat(json_bytes(_chat_view(data, call_type))))
            facts = request_facts(_client_headers(data), model=str_or_none(data.get("model")),
                                  policy=extraction.options.get("policy"), topic=extraction.options.get("topic"))
            request = accept(self.engine, self.config, extraction, facts)
        except ProxyError as exc:
            raise _rejection(exc.status, exc.payload()["error"]) from None
        if strip:
            data.pop(OUR_FIELD, None)
        return request

    def _remember(self, data: dict[str, Any], request: CheckRequest) -> None:
        metadata = data.setdefault(_metadata_key(data), {})
        if not isinstance(metadata, dict):
            return
        token = uuid.uuid4().hex  # ours, not the client's call id: a client cannot point at another's state
        metadata[_STATE] = token
        self._pending[token] = request
        while len(self._pending) > _MAX_PENDING:
            self._pending.popitem(last=False)

    def _recall(self, data: dict[str, Any], *, keep: bool = False) -> CheckRequest | None:
        metadata = data.get(_metadata_key(data))
        token = metadata.get(_STATE) if isinstance(metadata, dict) else None
        if not isinstance(token, str):
            return None
        return self._pending.get(token) if keep else self._pending.pop(token, None)

    async def async_pre_call_hook(self, user_api_key_dict: Any, cache: Any, data: dict[str, Any],
                                  call_type: Any) -> dict[str, Any]:
        if call_type in _CHECKED_CALLS:
            self._remember(data, self._intake(data, strip=True, call_type=call_type))
        return data

    async def async_moderation_hook(self, data: dict[str, Any], user_api_key_dict: Any, call_type: Any) -> None:
        if call_type in _CHECKED_CALLS and self._recall(data, keep=True) is None:  # pre_call may have read it
            self._remember(data, self._intake(data, strip=False, call_type=call_type))

    # --- the answer -------------------------------------------------------------------------------------------

    async def _review(self, data: dict[str, Any], answers: list[dict[str, Any]],
                      call_type: str) -> Verdict:
        """Each answer (a choice of the response) checked as its own request, one audit row each
        (`Guard.settle_choices`); a 400 when policy blocks any of them."""
        first = self._recall(data) or self._intake(data, strip=False, call_type=call_type)
        verdict = await (await self.guard()).settle_choices(first, answers, gateway=GATEWAY,
                                                            max_choices=self.config.proxy.max_choices)
        self._refuse(verdict)
        return verdict

    @staticmethod
    def _refuse(verdict: Verdict) -> None:
        if verdict.fails:
            raise _rejection(400, {"message": verdict.refusal or "", "type": "invalid_request_error", "param": None,
                                   "code": "morphguard_blocked"}, verdict.payload())

    def _keep_headers(self, data: dict[str, Any], record: DecisionRecord) -> None:
        self._headers[str(data.get("litellm_call_id"))] = record.headers()  # a stream's headers are sent already
        while len(self._headers) > _MAX_PENDING:
            self._headers.popitem(last=False)

    async def async_post_call_success_hook(self, data: dict[str, Any], user_api_key_dict: Any, response: Any) -> Any:
        call_type = _call_type(response)  # LiteLLM's own object for the API, never what the client wrote
        if call_type is None:
            return response  # not an answer of an API the guard reads (embeddings, images, ...)
        body = response.model_dump() if hasattr(response, "model_dump") else dict(response)
        if call_type in _RESPONSES_CALLS or call_type in _MESSAGES_CALLS:
            dialect = RESPONSES if call_type in _RESPONSES_CALLS else MESSAGES
            verdict = await self._review(data, [dialect.completion(body)], call_type)
            written = dialect.written(body, verdict.answers[0], False)
            _assign(response, {k: v for k, v in written.items() if k in ("output", "content")})
        else:
            text = call_type in _TEXT_CALLS
            verdict = await self._review(data, choices.each(body, text=text), call_type)
            for choice, changed in zip(response.choices, choices.rejoined(body, verdict.answers, text=text)["choices"],
                                       strict=False):
                if text:
                    choice.text = changed["text"]
                elif getattr(choice, "message", None) is not None and isinstance(changed["message"].get("content"),
                                                                                  str):
                    choice.message.content = changed["message"]["content"]
        self._keep_headers(data, verdict.deciding)
        _assign(response, {OUR_FIELD: verdict.payload()})
        return response

    async def async_post_call_streaming_iterator_hook(self, user_api_key_dict: Any, response: Any,
                                                      request_data: dict[str, Any]) -> AsyncGenerator[Any, None]:
        chunks = [chunk async for chunk in response]
        built = _built(chunks)
        if built is None:
            # A stream this guardrail cannot put together (Responses, Messages events): not checked, decided as the
            # profile's `on_error` says, and audited, whether or not the request was read before the call.
            call_type = _stream_call_type(chunks)
            request = self._recall(request_data) or self._intake(request_data, strip=False, call_type=call_type)
            self._refuse(await (await self.guard()).unread(request, "stream", gateway=GATEWAY))
            for chunk in chunks:
                yield chunk
            return
        answers = [choices.each(choice.model_dump())[0] for choice in built]
        verdict = await self._review(request_data, answers, "acompletion")
        changed = {i: prose(reviewed) for i, (reviewed, answer) in enumerate(zip(verdict.answers, answers,
                                                                                  strict=True))
                   if prose(reviewed) != prose(answer)}
        if changed:  # an action changed a choice's text: send what it left
            chunks = _replaced(chunks, changed)
        for chunk in chunks:
            yield chunk
        # The verdict as one more chunk with no choices, as morphguard's proxy sends it; LiteLLM relays an SSE event
        # given as bytes unchanged (its serializer of plain text chunks would drop an extra field).
        last = chunks[-1]
        payload: dict[str, Any] = {"id": getattr(last, "id", None), "object": "chat.completion.chunk",
                                   "created": getattr(last, "created", None), "model": getattr(last, "model", None),
                                   "choices": [], OUR_FIELD: verdict.payload()}
        yield b"data: " + json_bytes(payload) + b"\n\n"

    async def async_post_call_failure_hook(self, request_data: dict[str, Any], original_exception: Exception,
                                           user_api_key_dict: Any, traceback_str: str | None = None) -> None:
        request = self._recall(request_data)
        if request is not None:  # read before the call, never answered: still one audit row
            failed = dataclasses.replace(request, gateway=label(GATEWAY, FAILED))
            await (await self.guard()).account(failed, "upstream_error")

    async def async_post_call_response_headers_hook(self, data: dict[str, Any], user_api_key_dict: Any,
                                                    response: Any, request_headers: dict[str, str] | None = None,
                                                    litellm_call_info: dict[str, object] | None = None,
                                                    ) -> dict[str, str] | None:
        return self._headers.pop(str(data.get("litellm_call_id")), None)


def _chat_view(data: dict[str, Any], call_type: Any) -> dict[str, Any]:
    """The request of any API the guardrail reads, as a chat."""
    if call_type in _RESPONSES_CALLS:
        return RESPONSES.chat_view(data)
    if call_type in _MESSAGES_CALLS:
        return MESSAGES.chat_view(data)
    if call_type in _TEXT_CALLS:
        return choices.text_prompt_chat(data)
    return {k: data[k] for k in ("model", "messages", "stream", OUR_FIELD) if data.get(k) is not None}


def _built(chunks: list[Any]) -> list[Any] | None:
    """A chat stream's chunks as one response per choice; None for no chunks or the events of another API
    (Responses, Messages), which LiteLLM's builder cannot read. LiteLLM's builder reads every chunk as choice 0's, so
    the chunks of each choice (`n > 1`) are put together apart."""
    if not chunks or not all(isinstance(c, litellm.ModelResponseStream) for c in chunks):
        return None
    indices = sorted({getattr(choice, "index", 0) or 0 for chunk in chunks for choice in chunk.choices or []})
    if not indices:
        return None
    return [litellm.stream_chunk_builder([c.model_copy(update={"choices": [x for x in c.choices
                                                                          if (getattr(x, "index", 0) or 0) == i]})
                                          for c in chunks if any((getattr(x, "index", 0) or 0) == i
                                                                 for x in c.choices or [])])
            for i in indices]


def _metadata_key(data: dict[str, Any]) -> str:
    """Where LiteLLM keeps its own request metadata: `litellm_metadata` on the APIs whose `metadata` is the
    provider's (Responses, Messages), which LiteLLM would forward."""
    return "litellm_metadata" if isinstance(data.get("litellm_metadata"), dict) else "metadata"


def _call_type(response: Any) -> str | None:
    """The API of an answer the guardrail reads, by the object LiteLLM built for it."""
    if isinstance(response, litellm.ModelResponse):
        return "acompletion"
    if isinstance(response, litellm.TextCompletionResponse):
        return "atext_completion"
    if isinstance(response, ResponsesAPIResponse):
        return "aresponses"
    if isinstance(response, dict) and response.get("type") == "message":  # LiteLLM's Messages answer
        return "anthropic_messages"
    return None


def _stream_call_type(chunks: list[Any]) -> str:
    """The API of a stream LiteLLM's chat builder cannot read, by its events: Responses events are LiteLLM's
    `response.*` objects, text completion chunks its `TextCompletionResponse`; the rest are Messages events."""
    if chunks and all(isinstance(c, litellm.ModelResponseStream) for c in chunks):
        return "acompletion"  # a chat stream with no choice in it
    for chunk in chunks:
        if isinstance(chunk, litellm.TextCompletionResponse):
            return "atext_completion"
        kind = getattr(chunk, "type", None)
        if isinstance(kind, str) and kind.startswith("response."):
            return "aresponses"
    return "anthropic_messages"


def _assign(response: Any, fields: dict[str, Any]) -> None:
    for name, value in fields.items():
        if isinstance(response, dict):
            response[name] = value
        else:
            setattr(response, name, value)


def _rejection(status: int, error: dict[str, Any], decision: dict[str, Any] | None = None) -> HTTPException:
    """A rejection as LiteLLM's guardrails raise it; the client gets `detail` as the error."""
    detail: dict[str, Any] = {"error": error["message"], "code": error.get("code"), "param": error.get("param")}
    if decision is not None:
        detail[OUR_FIELD] = decision
    return HTTPException(status_code=status, detail=detail)


def _replaced(chunks: list[Any], texts: dict[int, str]) -> list[Any]:
    """The stream with the text of each choice in `texts` (by index) replaced: that choice's first content chunk
    carries its text, its others none."""
    placed: set[int] = set()
    for chunk in chunks:
        for choice in getattr(chunk, "choices", None) or []:
            index = getattr(choice, "index", 0) or 0
            delta = getattr(choice, "delta", None)
            if index not in texts or delta is None or getattr(delta, "content", None) is None:
                continue
            delta.content = "" if index in placed else texts[index]
            placed.add(index)
    return chunks


def _client_headers(data: dict[str, Any]) -> dict[str, str]:
    request = data.get("proxy_server_request")
    headers = request.get("headers") if isinstance(request, dict) else None
    return {str(k).lower(): str(v) for k, v in headers.items()} if isinstance(headers, dict) else {}

