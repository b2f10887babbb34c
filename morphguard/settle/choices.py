"""An answer of several choices settled as a gateway is told of it (Portkey's webhook, `/v1/check`, the LiteLLM
guardrail): each choice checked as its own answer, then the one verdict.

`settle` is the one verdict a gateway is told: the answer fails when policy blocks any choice (or, `flagged_fails`,
flags any), and the decision it is shown is that of the first failing choice, else the first flagged, else the
first. At most `proxy.max_choices` choices are checked; the rest are decided together by the profile's `on_error`
(reason `too_many_choices`, one audit row). Every audit row says what the gateway was told (`DecisionRecord.gateway`):
each choice is checked and decided first (`Settler.find`, `Settler.decide`), the verdict is formed, then each decision
is carried out and its row written with it (`Settler.carry_out`); one decision per request, the rows of what was not
checked written with the decision the verdict was formed from.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace
from typing import Any

from morphguard.errors import ProxyError
from morphguard.models import Decision
from morphguard.policy.answers import prose
from morphguard.policy.engine import Reach
from morphguard.policy.record import DecisionRecord
from morphguard.settle.check import Settler
from morphguard.settle.values import DENY, FAILED, PASS, TOO_MANY, Answer, CheckRequest, Found, Settled, Verdict, label


def _fails(decision: Decision | DecisionRecord, flagged_fails: bool) -> bool:
    # Decided with `Reach.REWRITE`, a `regenerate` rule has already become `block` (a gateway cannot re-ask).
    return decision.action == "block" or (flagged_fails and decision.flagged)


async def settle(settler: Settler, first: CheckRequest, answers: list[dict[str, Any]], *, gateway: str | None,
                 max_choices: int, flagged_fails: bool = False) -> Verdict:
    """Each answer (a choice) checked as its own request under its own id (`first`'s for the first), at most
    `max_choices` of them, and decided by policy (`Settler.decide`: a gateway cannot ask the model again, so
    `regenerate` withholds); the verdict formed; then each decision carried out and every record written, saying
    what the gateway was told. A bug in a check or its settling still leaves each choice its row (`internal_error`,
    told `failed`), then raises."""
    checked = [Answer(a) for a in answers[:max_choices]]
    requests = [first, *(replace(first, request_id=uuid.uuid4().hex) for _ in checked[1:])]
    found = await asyncio.gather(*(settler.find(r, a) for r, a in zip(requests, checked, strict=True)),
                                 return_exceptions=True)
    await _unless_broken(settler, requests, found, gateway, written=False)
    outcomes = [settler.decide(r, a, f, Reach.REWRITE) for r, a, f in zip(requests, checked, found, strict=True)
                if isinstance(f, Found)]
    rest = settler.trail.unchecked(first, TOO_MANY, failed=True) if len(answers) > max_choices else None
    decisions = [o.decision for o in outcomes] + ([rest] if rest is not None else [])
    fails = any(_fails(d, flagged_fails) for d in decisions)
    told = label(gateway, DENY if fails else PASS)
    results = await asyncio.gather(*(settler.carry_out(replace(r, gateway=told), a, o)
                                     for r, a, o in zip(requests, checked, outcomes, strict=True)),
                                   return_exceptions=True)
    await _unless_broken(settler, requests, results, gateway, written=True)
    settled = [r for r in results if isinstance(r, Settled)]
    reviewed = [s.answer.completion for s in settled] + answers[max_choices:]
    records = [s.record for s in settled]
    if rest is not None:
        records.append(await settler.trail.account(replace(first, request_id=uuid.uuid4().hex, gateway=told),
                                                   TOO_MANY, decision=rest))
    deciding = next((r for r in records if _fails(r, flagged_fails)), None) \
        or next((r for r in records if r.flagged), records[0])
    blocked = next((s.answer for s in settled if s.record.action == "block"), None)  # as policy withheld it
    refusal = prose(blocked.completion) if blocked is not None else None
    if refusal is None and rest is not None and rest.action == "block":
        refusal = rest.safe_message or settler.config.policy.safe_message
    return Verdict(reviewed, records, fails, deciding, refusal)


async def unread(settler: Settler, request: CheckRequest, reason: str, *, gateway: str | None,
                 flagged_fails: bool = False) -> Verdict:
    """An answer a gateway asked about that cannot be checked (a stream it relays without its text, an API morphguard
    cannot read): decided as the profile's `on_error` says, audited with `reason` and what the gateway was told."""
    decision = settler.trail.unchecked(request, reason, failed=True)
    fails = _fails(decision, flagged_fails)
    record = await settler.trail.account(replace(request, gateway=label(gateway, DENY if fails else PASS)), reason,
                                         decision=decision)
    refusal = (decision.safe_message or settler.config.policy.safe_message) if fails else None
    return Verdict([], [record], fails, record, refusal)


async def _unless_broken(settler: Settler, requests: list[CheckRequest], results: list[Any], gateway: str | None, *,
                         written: bool) -> None:
    """Where a step failed by a bug (an exception in `results`), the first exception raised once each request has its
    row (told `failed`): every request's, or, `written` (the others' rows are written), the failed ones'."""
    broken = [r for r in results if isinstance(r, BaseException)]
    if not broken:
        return
    for request, result in zip(requests, results, strict=True):
        if not written or isinstance(result, BaseException):
            await settler.trail.account(replace(request, gateway=label(gateway, FAILED)), _code(broken[0]))
    raise broken[0]


def _code(exc: BaseException) -> str:
    return (exc.code or "check_error") if isinstance(exc, ProxyError) else "internal_error"
