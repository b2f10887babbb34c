"""An answer of several choices (`n > 1`) as one answer per choice, and back; and the legacy text completions API
(`prompt` in, `choices[i].text` out) read as a chat.

The guard reads and rewrites one answer, the first choice's message (`policy.answers`). A gateway that relays a
response of several choices (Portkey's webhook, the LiteLLM guardrail) checks each as its own answer (`settle`), then
writes what policy made of each back in its place.

`settle` is the one verdict a gateway is told: the answer fails when policy blocks any choice (or, `flagged_fails`,
flags any), and the decision it is shown is that of the first failing choice, else the first flagged, else the
first. At most `proxy.max_choices` choices are checked; the rest are decided together by the profile's `on_error`
(reason `too_many_choices`, one audit row). Every audit row says what the gateway was told (`DecisionRecord.gateway`):
each choice is checked and decided first (`Guard.find`, `Guard.decide`), the verdict is formed, then each decision is
carried out and its row written with it (`Guard.carry_out`).
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, replace
from typing import Any

from morphguard.models import Decision
from morphguard.policy.answers import prose
from morphguard.policy.engine import Finding, Reach
from morphguard.policy.record import DecisionRecord
from morphguard.proxy.body import check_content
from morphguard.proxy.check import Answer, CheckRequest, Found, Settled
from morphguard.proxy.context import OUR_FIELD
from morphguard.proxy.errors import ProxyError, bad_request
from morphguard.proxy.guard import Guard

DENY, PASS, FAILED = "deny", "pass", "failed"
TOO_MANY = "too_many_choices"


def text_prompt_chat(body: dict[str, Any], where: str = "prompt") -> dict[str, Any]:
    """A text completion request as a chat: its prompt (a string or strings) as the user's message."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        prompt = "\n".join(prompt)
    if not isinstance(prompt, str):
        raise bad_request(f"'{where}' must be a string or an array of strings.", where)
    view: dict[str, Any] = {k: body[k] for k in ("model", "stream", OUR_FIELD) if k in body}
    return {**view, "messages": [{"role": "user", "content": prompt}]}


def each(response: dict[str, Any], *, text: bool = False, where: str = "choices") -> list[dict[str, Any]]:
    """Each choice of a chat (or, `text`, a text) completion as a chat completion of its own; 400 naming `where`
    for a response whose choices cannot be read."""
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices:
        raise bad_request(f"'{where}' must be a non-empty array.", where)
    out = []
    for i, choice in enumerate(choices):
        at = f"{where}[{i}]"
        if text:
            if not isinstance(choice, dict) or not isinstance(choice.get("text"), str):
                raise bad_request(f"'{at}' must be an object with a 'text' string.", at)
            message: dict[str, Any] = {"role": "assistant", "content": choice["text"]}
        else:
            if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
                raise bad_request(f"'{at}' must be an object with a 'message' object.", at)
            check_content(choice["message"].get("content"), f"{at}.message.content")
            message = choice["message"]
        out.append({**response, "choices": [{**choice, "index": 0, "message": message}]})
    return out


def rejoined(response: dict[str, Any], reviewed: list[dict[str, Any]], *, text: bool = False) -> dict[str, Any]:
    """The response with each choice as policy left it (`reviewed`, one completion per choice, in order)."""
    choices = []
    for original, checked in zip(response["choices"], reviewed, strict=True):
        if text:
            choices.append({**original, "text": prose(checked)})
        else:
            choices.append({**checked["choices"][0], "index": original.get("index")})
    return {**response, "choices": choices}


@dataclass
class Verdict:
    """What a gateway is told of an answer: each checked choice as policy left it (`answers`), every record (one
    per checked choice, and one for the choices past the cap), and whether the answer fails."""

    answers: list[dict[str, Any]]
    records: list[DecisionRecord]
    fails: bool
    deciding: DecisionRecord
    refusal: str | None  # what a client is shown instead of a failing answer: the first blocked choice as withheld

    def payload(self) -> dict[str, Any]:
        """The decision shown: the deciding record's, with each record's under `choices` when there are several."""
        data = self.deciding.payload()
        if len(self.records) > 1:
            data["choices"] = [r.payload() for r in self.records]
        return data


def _fails(decision: Decision | DecisionRecord, flagged_fails: bool) -> bool:
    # Decided with `Reach.REWRITE`, a `regenerate` rule has already become `block` (a gateway cannot re-ask).
    return decision.action == "block" or (flagged_fails and decision.flagged)


def label(gateway: str | None, told: str) -> str | None:
    return f"{gateway}:{told}" if gateway else None


async def settle(guard: Guard, first: CheckRequest, answers: list[dict[str, Any]], *, gateway: str | None,
                 max_choices: int, flagged_fails: bool = False) -> Verdict:
    """Each answer (a choice) checked as its own request under its own id (`first`'s for the first), at most
    `max_choices` of them, and decided by policy (`Guard.decide`: a gateway cannot ask the model again, so
    `regenerate` withholds); the verdict formed; then each decision carried out and every record written, saying
    what the gateway was told. A bug in a check or its settling still leaves each choice its row (`internal_error`,
    told `failed`), then raises."""
    checked = [Answer(a) for a in answers[:max_choices]]
    requests = [first, *(replace(first, request_id=uuid.uuid4().hex) for _ in checked[1:])]
    found = await asyncio.gather(*(guard.find(r, a) for r, a in zip(requests, checked, strict=True)),
                                 return_exceptions=True)
    await _unless_broken(guard, requests, found, gateway, written=False)
    outcomes = [guard.decide(r, a, f, Reach.REWRITE) for r, a, f in zip(requests, checked, found, strict=True)
                if isinstance(f, Found)]
    rest = _unchecked(guard, first, TOO_MANY) if len(answers) > max_choices else None
    decisions = [o.decision for o in outcomes] + ([rest] if rest is not None else [])
    fails = any(_fails(d, flagged_fails) for d in decisions)
    told = label(gateway, DENY if fails else PASS)
    results = await asyncio.gather(*(guard.carry_out(replace(r, gateway=told), a, o)
                                     for r, a, o in zip(requests, checked, outcomes, strict=True)),
                                   return_exceptions=True)
    await _unless_broken(guard, requests, results, gateway, written=True)
    settled = [r for r in results if isinstance(r, Settled)]
    reviewed = [s.answer.completion for s in settled] + answers[max_choices:]
    records = [s.record for s in settled]
    if rest is not None:
        records.append(await guard.account(replace(first, request_id=uuid.uuid4().hex, gateway=told), TOO_MANY,
                                           failed=True))
    deciding = next((r for r in records if _fails(r, flagged_fails)), None) \
        or next((r for r in records if r.flagged), records[0])
    blocked = next((s.answer for s in settled if s.record.action == "block"), None)  # as policy withheld it
    refusal = prose(blocked.completion) if blocked is not None else None
    if refusal is None and rest is not None and rest.action == "block":
        refusal = rest.safe_message or guard.config.policy.safe_message
    return Verdict(reviewed, records, fails, deciding, refusal)


async def unread(guard: Guard, request: CheckRequest, reason: str, *, gateway: str | None,
                 flagged_fails: bool = False) -> Verdict:
    """An answer a gateway asked about that cannot be checked (a stream it relays without its text, an API morphguard
    cannot read): decided as the profile's `on_error` says, audited with `reason` and what the gateway was told."""
    decision = _unchecked(guard, request, reason)
    fails = _fails(decision, flagged_fails)
    record = await guard.account(replace(request, gateway=label(gateway, DENY if fails else PASS)), reason,
                                 failed=True)
    refusal = (decision.safe_message or guard.config.policy.safe_message) if fails else None
    return Verdict([], [record], fails, record, refusal)


def _unchecked(guard: Guard, request: CheckRequest, reason: str) -> Decision:
    """Policy's decision on an answer not checked for `reason`, as `Guard.account(failed=True)` will record it."""
    return guard.engine.decide(request.profile, request.topic, Finding(failed=reason))


async def _unless_broken(guard: Guard, requests: list[CheckRequest], results: list[Any], gateway: str | None, *,
                         written: bool) -> None:
    """Where a step failed by a bug (an exception in `results`), the first exception raised once each request has its
    row (told `failed`): every request's, or, `written` (the others' rows are written), the failed ones'."""
    broken = [r for r in results if isinstance(r, BaseException)]
    if not broken:
        return
    for request, result in zip(requests, results, strict=True):
        if not written or isinstance(result, BaseException):
            await guard.account(replace(request, gateway=label(gateway, FAILED)), _code(broken[0]))
    raise broken[0]


def _code(exc: BaseException) -> str:
    return (exc.code or "check_error") if isinstance(exc, ProxyError) else "internal_error"
