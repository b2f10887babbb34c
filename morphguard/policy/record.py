"""One record per request the proxy accepted, and every view of it.

The client's `morphguard` object (`payload`), the `x-morphguard-*` headers (`headers`) and the audit
row (`row`, whose columns are this model's fields) all come from `DecisionRecord`, so they cannot drift
apart. The verdict is this record as the client sees it; what the judge says of one statement is a judgment.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar

from pydantic import BaseModel, Field

from morphguard.config import Action
from morphguard.models import Decision, Detection, Factoid
from morphguard.policy.actions import claims


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


class EvidenceRecord(BaseModel):
    """Where the context bears on a claim: a passage (1-based) and offsets in it. Never the text: the context
    is stored as `store_text` says, and the place is read from it."""

    passage: int
    start: int
    end: int


class FactoidRecord(BaseModel):
    text: str
    start: int | None = None
    end: int | None = None
    score: float
    flagged: bool
    # for a reviewer (the audit row only): what the context says of the claim, why, and where
    label: str | None = None
    reason: str | None = None
    evidence: list[EvidenceRecord] = Field(default_factory=list)

    REVIEW_ONLY: ClassVar[frozenset[str]] = frozenset({"label", "reason", "evidence"})

    @classmethod
    def of(cls, factoid: Factoid, threshold: float) -> FactoidRecord:
        return cls(text=factoid.text, start=factoid.start, end=factoid.end, score=round(factoid.score, 4),
                   flagged=factoid.score >= threshold, label=factoid.label, reason=factoid.reason or None,
                   evidence=[EvidenceRecord(passage=e.passage, start=e.start, end=e.end) for e in factoid.evidence])


@dataclass(frozen=True)
class Released:
    """What of a streamed answer reached the client before its verdict: `chars` characters of its text, which
    passed a check scoring `score` (`flagged` or not); None where no checked text went out."""

    chars: int
    score: float | None = None
    flagged: bool | None = None

    def fields(self) -> dict[str, Any]:
        return {"released_chars": self.chars, "released_score": self.score, "released_flagged": self.flagged}


class DecisionRecord(BaseModel):
    # Field order is the audit table's column order (and CSV export's): keep old columns first.
    time: str = Field(default_factory=now)
    request_id: str
    trace_id: str | None = None
    profile: str
    route: str | None = None
    model: str | None = None
    topic: str
    checked: bool = False
    score: float | None = None
    threshold: float | None = None  # None while the check is still queued
    flagged: bool = False
    action: Action = "pass"
    escalated: bool = False
    reason: str | None = None  # why the answer was not checked, or what the check could not do
    detector: str | None = None
    factoids: list[FactoidRecord] = Field(default_factory=list)
    cost: dict[str, Any] | None = None
    question: str | None = None
    answer: str | None = None
    context: str | None = None
    context_source: str | None = None
    latency_ms: int | None = None
    regenerations: int = 0
    text_kept_until: str | None = None  # full text kept for review until then (policy.audit.keep_text)
    # A stream checked as it flows: how much of the answer text the client received before the verdict, and the
    # check that text passed. The verdict above is then the rest's: `block` withheld that rest, never what went.
    released_chars: int | None = None
    released_score: float | None = None
    released_flagged: bool | None = None
    # An answer a gateway asked about: which gateway, and what morphguard told it, as `<gateway>:<told>`: `deny`
    # (withhold the answer), `pass`, or `failed` (no verdict reached it; its own error setting decided)
    gateway: str | None = None
    # each step that moved the check's score (a calibration, a cascade branch, a floor): its name, the score before
    # and after, and a line a reviewer reads (`Detection.settings["explanation"]`); None: the detector records none
    explanation: list[dict[str, Any]] | None = None
    # the answer was due a check that could not decide (`reason` says why) and went out all the same (`fail_open`)
    unchecked: bool = False

    # kept in the audit trail, never sent to the client
    AUDIT_ONLY: ClassVar[frozenset[str]] = frozenset({"time", "route", "model", "cost", "question", "answer",
                                                      "context", "text_kept_until", "gateway", "explanation"})
    TEXTS: ClassVar[tuple[str, ...]] = ("question", "answer", "context")  # stored as `store_text` says

    @classmethod
    def of_check(cls, *, request_id: str, decision: Decision, detection: Detection | None, latency_ms: float,
                 **facts: Any) -> DecisionRecord:
        """The record of a check that ran (or failed and fell back to `on_error`)."""
        checked = {}
        if detection is not None:
            checked = {"checked": True, "detector": detection.detector, "score": round(detection.score, 4),
                       "latency_ms": round(latency_ms),
                       "factoids": [FactoidRecord.of(f, decision.threshold) for f in claims(detection.factoids)],
                       "cost": detection.cost.model_dump(exclude={"stages"}),
                       "explanation": _explanation(detection)}
        return cls(request_id=request_id, profile=decision.profile, topic=decision.topic, flagged=decision.flagged,
                   action=decision.action, threshold=decision.threshold, escalated=decision.escalate,
                   reason=decision.reason, unchecked=decision.unchecked, **checked, **facts)

    def payload(self) -> dict[str, Any]:
        """The `morphguard` object in the completion (or the stream's verdict chunk)."""
        out = self.model_dump(exclude=set(self.AUDIT_ONLY), exclude_none=True)
        if not self.checked:
            del out["factoids"]
        else:
            for factoid in out["factoids"]:
                for name in FactoidRecord.REVIEW_ONLY & factoid.keys():
                    del factoid[name]
                if self.action == "block":  # where the blocked claims were and how they scored, never their words
                    del factoid["text"]
        if not self.regenerations:
            del out["regenerations"]
        if not self.unchecked:
            del out["unchecked"]
        return out

    def headers(self) -> dict[str, str]:
        out = {"x-morphguard-action": self.action, "x-morphguard-checked": str(self.checked).lower(),
               "x-morphguard-request-id": self.request_id}
        if self.checked and self.score is not None:
            out["x-morphguard-score"] = f"{self.score:.4f}"
            out["x-morphguard-flagged"] = str(self.flagged).lower()
        if self.unchecked:
            out["x-morphguard-unchecked"] = "true"
        return out

    def escalation(self) -> dict[str, Any]:
        """What the escalation webhook gets: the whole decision, never the texts."""
        return self.model_dump(exclude=set(self.TEXTS))


def _explanation(detection: Detection) -> list[dict[str, Any]] | None:
    steps = detection.settings.get("explanation")
    return [dict(step) for step in steps if isinstance(step, dict)] if isinstance(steps, list) and steps else None
