"""A Guardrails AI validator: an answer fails when morphguard flags it against its context.

The validator is a client of `POST /v1/check` of a running `morphguard serve` (docs/integrations.md), so the check
is the whole guard's: the configured detector and judge, the policy's profile and topic, the audit trail and
escalation. The question and context come in the validation metadata:

    guard = Guard().use(GroundedInContext(url="http://morphguard:8080", api_key=KEY, on_fail="fix"))
    guard.validate(answer, metadata={"question": question, "context": passages})

An answer fails when the check flags it, or when policy blocks it unchecked: a check that could not run (its judge
down, a budget exceeded) under a profile that fails closed, as one that blocks does unless it says
`on_error: fail_open`. Its fix is the answer as the policy's action leaves it (the safe message of a block, the
marked claims of `highlight`), and its error spans are the flagged claims.
"""

from __future__ import annotations

from typing import Any

import httpx
from guardrails.validator_base import (
    ErrorSpan,
    FailResult,
    PassResult,
    ValidationResult,
    Validator,
    register_validator,
)


@register_validator(name="morphguard/grounded_in_context", data_type="string")
class GroundedInContext(Validator):
    required_metadata_keys = ["context"]

    def __init__(self, url: str, api_key: str, *, headers: dict[str, str] | None = None, timeout_s: float = 60.0,
                 on_fail: Any = None, **kwargs: Any) -> None:
        # the key stays out of the arguments Guardrails keeps (and may log); the headers may select a profile
        super().__init__(on_fail=on_fail, url=url, timeout_s=timeout_s, **kwargs)
        self._endpoint = url.rstrip("/") + "/v1/check"
        self._headers = {**(headers or {}), "authorization": f"Bearer {api_key}"}
        self._timeout_s = timeout_s

    def _validate(self, value: Any, metadata: dict[str, Any]) -> ValidationResult:
        body = {"question": metadata.get("question") or "", "context": metadata["context"], "answer": value}
        for key in ("model", "topic", "policy"):
            if metadata.get(key) is not None:
                body[key] = metadata[key]
        response = httpx.post(self._endpoint, json=body, headers=self._headers, timeout=self._timeout_s)
        if response.status_code != 200:
            error = _error_message(response)
            raise RuntimeError(f"morphguard could not check the answer (HTTP {response.status_code}): {error}")
        verdict = response.json()
        if not verdict.get("flagged") and verdict.get("action") != "block":
            return PassResult()
        spans = [ErrorSpan(start=f["start"], end=f["end"], reason=f"unsupported by the context (score {f['score']})")
                 for f in verdict.get("factoids", []) if f.get("flagged") and f.get("start") is not None]
        reason = (f"the answer is not supported by its context (score {verdict['score']})" if verdict.get("checked")
                  else f"the answer could not be checked ({verdict.get('reason')}) and policy blocks it")
        return FailResult(error_message=reason, fix_value=verdict.get("answer"), error_spans=spans or None,
                          metadata={"morphguard": verdict})


def _error_message(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text[:200]
