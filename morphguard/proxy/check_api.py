"""Checks of answers a caller already has, for gateways that call a guardrail rather than route through one.

`POST /v1/check` takes a question, its context (a string or a list of passages) and an answer, with an optional
model and topic and profile hints and the name of the gateway it checks for (`gateway`, recorded in the audit row
with what it was told), and answers with the decision (`DecisionRecord.payload`: score, flagged, the
spans of the claims, the action) and the answer as that action leaves it. A gateway's webhook (`/v1/check/<name>`)
is the same check in that gateway's shape; the app is handed them (`create_app`'s `webhooks`: Portkey's, from
`integrations.portkey`, where `morphguard serve` builds the app), so the edge imports no integration.

Both spend judge calls and write audit rows, and no provider authenticates them: a caller must present one of
`proxy.keys` (without any, both answer 401). They take requests in through the request path's own intake
(`flow.accept`: the same route rules, topics and hints), and every check they run leaves one audit row, like a chat
request's. One difference: the model a check names is only the caller's word for who wrote the answer, so it is
recorded but selects no route (`RequestFacts.model_named`); a check's profile follows from the caller's key and
headers, never from a label it chose.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from morphguard.config import ProxySettings
from morphguard.models import RagInput
from morphguard.policy.answers import prose
from morphguard.proxy.body import parse_object
from morphguard.proxy.context import Extraction
from morphguard.proxy.credentials import present_keys, presented_key
from morphguard.proxy.errors import JSON, bad_request, unauthorized
from morphguard.proxy.flow import Flow, accept, address_of, request_facts

_NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")


def completion_of(answer: str, model: str | None = None) -> dict[str, Any]:
    """An answer as the chat completion the guard reads and rewrites."""
    return {"object": "chat.completion", "model": model or "unknown",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}]}


Webhook = Callable[[Flow, Request, dict[str, Any]], Awaitable[Response]]  # a gateway's reply to its parsed call


class CheckApi:
    def __init__(self, settings: ProxySettings, flow: Callable[[], Flow],
                 webhooks: Mapping[str, Webhook] | None = None) -> None:
        self._flow = flow  # the proxy's request path, built when the app starts
        self._keys = [k.get_secret_value().encode() for k in settings.keys]
        self._webhooks = dict(webhooks or {})  # by gateway name: served at /v1/check/<name>

    def routes(self) -> list[Route]:
        return [Route("/v1/check", self.check, methods=["POST"]),
                *(Route(f"/v1/check/{name}", self._webhook(webhook), methods=["POST"])
                  for name, webhook in self._webhooks.items())]

    def _authenticate(self, request: Request) -> None:
        """The caller's key (read as the request path reads it) must be one of `proxy.keys`, compared in constant
        time."""
        present_keys(request.headers)
        presented = presented_key({k.lower(): v for k, v in request.headers.items()})
        if not presented or not any(hmac.compare_digest(presented.encode("utf-8", "surrogateescape"), key)
                                    for key in self._keys):
            raise unauthorized()

    async def check(self, request: Request) -> Response:
        self._authenticate(request)
        flow = self._flow()
        body = parse_object(await flow.read_body(request))
        question = _required_text(body, "question")
        answer = _required_text(body, "answer")
        passages = _passages(body.get("context"))
        model = _text(body, "model")
        rag = RagInput(question=question, passages=passages, turns=[question])
        chat = {"model": model, "messages": [{"role": "user", "content": question}]}
        facts = replace(request_facts(request.headers, model=model, policy=_text(body, "policy"),
                                      topic=_text(body, "topic"), address=address_of(request)), model_named=True)
        gateway = _gateway(body)
        intake = accept(flow.engine, flow.config, Extraction(chat, rag, "explicit"), facts)
        verdict = await flow.guard.settle_choices(intake, [completion_of(answer, model)], gateway=gateway,
                                                  max_choices=1)
        return JSON({"object": "morphguard.check", **verdict.payload(), "answer": prose(verdict.answers[0])},
                    headers=verdict.deciding.headers())

    def _webhook(self, webhook: Webhook) -> Callable[[Request], Awaitable[Response]]:
        async def answer(request: Request) -> Response:
            self._authenticate(request)
            flow = self._flow()
            return await webhook(flow, request, parse_object(await flow.read_body(request)))
        return answer


def _gateway(body: dict[str, Any]) -> str | None:
    """The gateway a caller says it checks for (`nemo`, as the NeMo rail sends): recorded with what it was told."""
    name = _text(body, "gateway")
    if name is not None and not _NAME.fullmatch(name):
        raise bad_request("'gateway' must be a short name: lower-case letters, digits, '-' or '_' (at most 32).",
                          "gateway")
    return name


def _text(body: dict[str, Any], name: str) -> str | None:
    return None if body.get(name) is None else _required_text(body, name)


def _required_text(body: dict[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str):
        raise bad_request(f"'{name}' must be a string.", name)
    return value


def _passages(context: Any) -> list[str]:
    if isinstance(context, str):
        context = [context]
    if not isinstance(context, list) or not all(isinstance(p, str) for p in context):
        raise bad_request("'context' must be a string or an array of strings.", "context")
    passages = [p for p in context if p.strip()]
    if not passages:
        raise bad_request("'context' holds no text: there is nothing to check the answer against.", "context")
    return passages
