"""What the client sees of a review: the `morphguard` object in the completion and the `x-morphguard-*` headers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from morphguard.proxy.guard import Checked, Review


def verdict(review: Review, result: Checked, attempts: int = 0, trace_id: str | None = None) -> dict[str, Any]:
    d, detection = result.decision, result.detection
    out: dict[str, Any] = {
        "checked": detection is not None,
        "request_id": review.request_id,
        "profile": d.profile,
        "topic": d.topic,
        "threshold": d.threshold,
        "flagged": d.flagged,
        "action": d.action,
        "escalated": d.escalate,
        "context_source": review.source,
    }
    if d.reason:
        out["reason"] = d.reason
    if detection is not None:
        out |= {
            "detector": detection.detector,
            "score": round(detection.score, 4),
            "factoids": [{"text": f.text, "start": f.start, "end": f.end, "score": round(f.score, 4),
                          "flagged": f.score >= d.threshold} for f in detection.factoids],
            "latency_ms": round(result.latency_ms),
        }
    if attempts:
        out["regenerations"] = attempts
    if trace_id:
        out["trace_id"] = trace_id
    return out


def pending(review: Review, reason: str) -> dict[str, Any]:
    """The verdict sent at once when the check runs later (`queued`), or not at all (`dropped`, `no_context`)."""
    return {"checked": False, "request_id": review.request_id, "profile": review.profile, "topic": review.topic,
            "flagged": False, "action": "pass", "reason": reason, "context_source": review.source}


def headers(verdict: dict[str, Any]) -> dict[str, str]:
    out = {"x-morphguard-action": str(verdict.get("action", "pass")),
           "x-morphguard-checked": str(verdict["checked"]).lower(),
           "x-morphguard-request-id": str(verdict.get("request_id", ""))}
    if verdict["checked"]:
        out["x-morphguard-score"] = f"{verdict['score']:.4f}"
        out["x-morphguard-flagged"] = str(verdict["flagged"]).lower()
    return out
