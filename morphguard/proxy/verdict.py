"""Turning a detection into what the client sees: the `morphguard` object, headers, and a block."""

from __future__ import annotations

from typing import Any

from morphguard.models import Detection

ANNOTATE, BLOCK = "annotate", "block"


def checked(detection: Detection, action: str, latency_ms: float, source: str | None) -> dict[str, Any]:
    return {
        "checked": True,
        "detector": detection.detector,
        "score": round(detection.score, 4),
        "threshold": detection.threshold,
        "flagged": detection.flagged,
        "action": action,
        "context_source": source,
        "factoids": [{"text": f.text, "start": f.start, "end": f.end, "score": round(f.score, 4)}
                     for f in detection.factoids],
        "latency_ms": round(latency_ms),
    }


def not_checked(reason: str, **extra: Any) -> dict[str, Any]:
    """`reason`: no_context, no_answer, detector_error, queued (async), dropped (async queue full)."""
    return {"checked": False, "reason": reason, "action": "pass", **extra}


def headers(verdict: dict[str, Any]) -> dict[str, str]:
    out = {"x-morphguard-action": str(verdict.get("action", "pass")),
           "x-morphguard-checked": str(verdict["checked"]).lower()}
    if verdict["checked"]:
        out["x-morphguard-score"] = f"{verdict['score']:.4f}"
        out["x-morphguard-flagged"] = str(verdict["flagged"]).lower()
    return out


def block_completion(completion: dict[str, Any], safe_message: str) -> dict[str, Any]:
    """The same completion with the first choice's answer replaced by the safe message."""
    choices = completion.get("choices") or [{"index": 0}]
    first = dict(choices[0])
    first["message"] = {**(first.get("message") or {}), "role": "assistant", "content": safe_message}
    first["finish_reason"] = "content_filter"
    return {**completion, "choices": [first, *choices[1:]]}
