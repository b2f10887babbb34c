"""The action of morphguard's NeMo Guardrails output rail: the bot message checked by `morphguard serve`.

`morphguard_check` sends `POST /v1/check` the user's question (`$user_message`), NeMo's retrieved context
(`$relevant_chunks`) and the answer (`$bot_message`), naming itself (`gateway: nemo`, so that the audit row says what
NeMo was told), and takes back the decision. It sets `$bot_message` to the
answer as the profile's action left it (the safe message of a block, the claims marked by `highlight`, ...) and
`$morphguard` to the decision (request id, profile, score, flagged, action, reason), and returns whether the answer
may go out: false when policy blocks it, or when morphguard cannot be asked (down, a wrong key, slower than
`timeout_s`), in which case `$bot_message` becomes `refusal`. Without context there is nothing to check against: the
answer passes, `$morphguard` says `checked: false`, reason `no_context`.

Settings, under `custom_data.morphguard` in NeMo's config.yml: `url` (morphguard's base URL), `api_key_env` (the
environment variable holding a `proxy.keys` key; default `MORPHGUARD_API_KEY`), `headers` (sent with each check,
for morphguard's route rules, e.g. `x-tenant`), `timeout_s` (default 10), `refusal` (what the user gets when the
check cannot be made), `topic` and `policy` (hints, as `/v1/check` takes them).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import httpx
from nemoguardrails.actions import action
from nemoguardrails.actions.actions import ActionResult

log = logging.getLogger(__name__)

REFUSAL = "I cannot check this answer against the sources right now, so I will not give it."


@action(name="morphguard_check", is_system_action=True)
async def morphguard_check(context: dict[str, Any] | None = None, config: Any = None) -> ActionResult:
    context = context or {}
    settings: dict[str, Any] = dict(((getattr(config, "custom_data", None) or {}).get("morphguard")) or {})
    answer = context.get("bot_message") or ""
    chunks = context.get("relevant_chunks") or ""
    refusal = settings.get("refusal") or REFUSAL
    if not str(chunks).strip():
        decision = {"checked": False, "reason": "no_context", "action": "pass"}
        return ActionResult(return_value=True, context_updates={"morphguard": decision})
    body = {"question": context.get("user_message") or "", "context": str(chunks), "answer": answer,
            "gateway": "nemo", **{k: settings[k] for k in ("topic", "policy") if settings.get(k)}}
    key = os.environ.get(settings.get("api_key_env") or "MORPHGUARD_API_KEY", "")
    headers = {**(settings.get("headers") or {}), "Authorization": f"Bearer {key}"}
    try:
        async with httpx.AsyncClient(timeout=float(settings.get("timeout_s") or 10)) as client:
            reply = await client.post(f"{str(settings['url']).rstrip('/')}/v1/check", json=body, headers=headers)
        reply.raise_for_status()
        decision = reply.json()
        checked_answer = decision.pop("answer")
    except (httpx.HTTPError, KeyError, ValueError) as exc:  # cannot be asked: fail closed
        log.warning("morphguard check failed: %s", type(exc).__name__)
        decision = {"checked": False, "reason": "morphguard_unavailable", "action": "block"}
        return ActionResult(return_value=False, context_updates={"morphguard": decision, "bot_message": refusal})
    return ActionResult(return_value=decision.get("action") != "block",
                        context_updates={"morphguard": decision, "bot_message": checked_answer})
