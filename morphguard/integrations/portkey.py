"""The check in the shape of Portkey's webhook guardrail (`POST /v1/check/portkey`).

Portkey's gateway calls the webhook before the request (`beforeRequestHook`: there is no answer yet, so nothing is
checked or accepted) and after the model answered (`afterRequestHook`), with the request and the response it
relayed. What Portkey relays is read in the API it names (`requestType`): chat completions (`chatComplete`),
Anthropic's Messages (`messages`) and text completions (`complete`), the only ones Portkey runs output guardrails
on. Each choice of a chat or text completion is an answer of its own, checked as its own request (one audit row
each, at most `proxy.max_choices` of them: `Guard.settle_choices`); the webhook's verdict is false when policy blocks
any of them, or, with `proxy.portkey.flagged_is_failure`, when any is flagged. A stream reaches the webhook without its
answer (`response.json` is null): it cannot be checked, and is decided as the profile's `on_error` says. A
`requestType` morphguard cannot read is decided the same way. Every answer accepted leaves one audit row, its reason
saying why it was not checked where it was not, and what Portkey was told (`portkey:deny` or `portkey:pass`; whether
Portkey then withheld a denied answer depends on its check's `deny` setting, which morphguard does not see).

The reply is Portkey's: `verdict`, `data` (the decision, as a chat completion's `morphguard` field carries it; for
several choices, the one that decided the verdict, and each choice's under `choices`), and `transformedData` with
the response as policy's actions left it, where they changed it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from morphguard.policy.answers import prose
from morphguard.proxy import choices
from morphguard.proxy.body import parse_chat, str_or_none
from morphguard.proxy.context import Extraction
from morphguard.proxy.dialects.messages import Messages
from morphguard.proxy.errors import JSON, ProxyError, bad_request, json_bytes
from morphguard.proxy.flow import Flow, accept, address_of, request_facts
from morphguard.settle.values import CheckRequest, Verdict

EVENTS = ("beforeRequestHook", "afterRequestHook")
GATEWAY = "portkey"  # as the audit rows name it (`DecisionRecord.gateway`)
CHAT, MESSAGES, TEXT = "chatComplete", "messages", "complete"


async def webhook(flow: Flow, request: Request, hook: dict[str, Any]) -> Response:
    """Portkey's reply to one webhook call (`hook`: its parsed body)."""
    flagged_is_failure = flow.settings.portkey.flagged_is_failure
    event = hook.get("eventType")
    if event not in EVENTS:
        raise bad_request(f"'eventType' must be one of: {', '.join(EVENTS)}.", "eventType")
    sent = _object(hook, "request")
    if event == "beforeRequestHook":  # no answer yet: nothing to check, nothing accepted
        return JSON({"verdict": True, "data": {"checked": False, "reason": "before_request"}})
    kind = hook.get("requestType", CHAT)
    given = hook.get("metadata")
    metadata: dict[str, Any] = given if isinstance(given, dict) else {}
    sent_json = sent.get("json")
    received = _object(hook, "response")
    answer = received.get("json")
    if kind not in (CHAT, MESSAGES, TEXT):
        intake = _intake(flow, request, {}, metadata)
        return _reply(await flow.guard.unread(intake, "unsupported_request_type", gateway=GATEWAY,
                                              flagged_fails=flagged_is_failure), None)
    if not isinstance(sent_json, dict):
        raise bad_request("'request.json' must be an object.", "request.json")
    chat = _chat_view(kind, sent_json)
    if answer is None:  # a stream: Portkey calls the webhook without its answer
        intake = _intake(flow, request, chat, metadata)
        return _reply(await flow.guard.unread(intake, "stream", gateway=GATEWAY,
                                              flagged_fails=flagged_is_failure), None)
    if not isinstance(answer, dict):
        raise bad_request("'response.json' must be an object or null.", "response.json")
    answers = _answers(kind, answer)
    # One reading of the request for every choice; each choice is its own audited answer, under its own id.
    verdict = await flow.guard.settle_choices(_intake(flow, request, chat, metadata), answers, gateway=GATEWAY,
                                              max_choices=flow.settings.max_choices, flagged_fails=flagged_is_failure)
    changed = None
    if any(r != a for r, a in zip(verdict.answers, answers, strict=True)):
        changed = _written(kind, answer, verdict.answers, any(r.action == "block" for r in verdict.records))
    return _reply(verdict, changed)


def _reply(verdict: Verdict, changed: dict[str, Any] | None) -> Response:
    out: dict[str, Any] = {"verdict": not verdict.fails, "data": verdict.payload()}
    if changed is not None:
        out["transformedData"] = {"response": {"json": changed, "text": _text_of(changed)}}
    return JSON(out, headers=verdict.deciding.headers())


def _intake(flow: Flow, request: Request, chat: dict[str, Any], metadata: dict[str, Any]) -> CheckRequest:
    """The request as policy sees it: context, profile (route rules on the webhook's headers; the request's
    `morphguard` field or Portkey metadata for hints), topic. A chat view that cannot be read is a 400."""
    if chat:
        try:
            parsed = parse_chat(json_bytes(chat))
        except ProxyError as exc:
            raise bad_request(f"request.json: {exc.message}", f"request.json.{exc.param}" if exc.param else
                              "request.json") from None
        extraction = flow.extractor.extract(parsed)
    else:
        extraction = Extraction({}, None)
    options = extraction.options
    # The model is the relayed request's word for it, recorded but selecting no route (`RequestFacts.model_named`).
    facts = replace(request_facts(request.headers, model=str_or_none(chat.get("model")),
                                  policy=str_or_none(options.get("policy"))
                                  or str_or_none(metadata.get("morphguard_policy")),
                                  topic=str_or_none(options.get("topic"))
                                  or str_or_none(metadata.get("morphguard_topic")), address=address_of(request)),
                    model_named=True)
    return accept(flow.engine, flow.config, extraction, facts)


def _chat_view(kind: str, body: dict[str, Any]) -> dict[str, Any]:
    """The request Portkey relayed, read as a chat (what context extraction reads)."""
    if kind == TEXT:
        return choices.text_prompt_chat(body, "request.json.prompt")
    if kind == MESSAGES:
        try:
            return Messages.chat_view(body)
        except ProxyError as exc:
            raise bad_request(f"request.json: {exc.message}", "request.json") from None
    return body


def _answers(kind: str, answer: dict[str, Any]) -> list[dict[str, Any]]:
    """Each answer of the response, as the chat completion the guard reads and rewrites."""
    if kind == MESSAGES:
        try:
            return [Messages.completion(answer)]
        except ProxyError:
            raise bad_request("'response.json' must be a message with a 'content' array.", "response.json") from None
    return choices.each(answer, text=kind == TEXT, where="response.json.choices")


def _written(kind: str, answer: dict[str, Any], reviewed: list[dict[str, Any]], blocked: bool) -> dict[str, Any]:
    """The response with what policy made of each answer written back in its API's shape."""
    if kind == MESSAGES:
        return Messages.written(answer, reviewed[0], blocked)
    return choices.rejoined(answer, reviewed, text=kind == TEXT)


def _text_of(response: dict[str, Any]) -> str:
    if isinstance(response.get("content"), list):  # a message
        return "".join(b.get("text", "") for b in response["content"] if isinstance(b, dict))
    return "\n".join(c.get("text") or prose({"choices": [c]}) for c in response.get("choices", [])
                     if isinstance(c, dict))


def _object(parent: dict[str, Any], name: str) -> dict[str, Any]:
    value = parent.get(name)
    if not isinstance(value, dict):
        raise bad_request(f"'{name}' must be an object.", name)
    return value
