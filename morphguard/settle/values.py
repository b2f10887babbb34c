"""What one check is about (`CheckRequest`), the answer it reads (`Answer`), what the check found (`Found`), policy's
decision on it (`CheckOutcome`), the answer as the guard leaves it (`Settled`) and what a gateway is told of an answer
of several choices (`Verdict`): the typed values the request path hands to the settle side and gets back."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, TraceFlags

from morphguard.models import Decision, Detection, RagInput
from morphguard.policy import answers
from morphguard.policy.answers import as_completion
from morphguard.policy.engine import Finding, Holds
from morphguard.policy.record import DecisionRecord

Reask = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]  # how to ask the provider again (`regenerate`)


@dataclass
class CheckRequest:
    """One accepted request as policy sees it."""

    body: dict[str, Any]  # the request as forwarded upstream
    rag: RagInput | None
    source: str | None
    profile: str
    topic: str
    model: str | None = None
    route: str = ""
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    chat_span: Span | None = None  # the upstream call's span, which the evaluation event goes on
    detector: str | None = None  # named by the request (morphguard.detector); None: the configured one
    client: str = ""  # who asked, for fair shares of the judge and the threads (`fairness.client_id`: never the key)
    gateway: str | None = None  # the gateway that asked and what it was told (`DecisionRecord.gateway`)

    def to_dict(self) -> dict[str, Any]:
        """What the durable queue keeps; the chat span survives as the context a check links to."""
        link = self.chat_span.get_span_context() if self.chat_span is not None else None
        return {"body": self.body, "rag": self.rag.model_dump() if self.rag else None, "source": self.source,
                "profile": self.profile, "topic": self.topic, "model": self.model, "route": self.route,
                "request_id": self.request_id, "detector": self.detector, "client": self.client,
                "gateway": self.gateway,
                "link": [link.trace_id, link.span_id] if link is not None and link.is_valid else None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CheckRequest:
        link = data.get("link")
        span = NonRecordingSpan(SpanContext(link[0], link[1], is_remote=True, trace_flags=TraceFlags(1))) \
            if link else None
        rag = RagInput.model_validate(data["rag"]) if data.get("rag") else None
        return cls(body=data["body"], rag=rag, source=data.get("source"), profile=data["profile"],
                   topic=data["topic"], model=data.get("model"), route=data.get("route") or "",
                   request_id=data["request_id"], chat_span=span, detector=data.get("detector"),
                   client=data.get("client") or "", gateway=data.get("gateway"))

    def pending(self, reason: str) -> DecisionRecord:
        """The record sent at once when the check runs later (`queued`) or not at all."""
        return DecisionRecord(request_id=self.request_id, profile=self.profile, topic=self.topic, reason=reason,
                              context_source=self.source)


@dataclass(frozen=True)
class Answer:
    """The provider's answer as the dialect reads it: `completion`, the chat completion every field that carries
    the model's words is translated into (what the check reads and the actions rewrite), and `response`, the
    answer in its API's own shape (None where there is none: an answer a caller hands in, a stream's prefix)."""

    completion: dict[str, Any]
    response: dict[str, Any] | None = None

    @classmethod
    def of_text(cls, text: str) -> Answer:
        """An answer of this text alone (a prefix of a stream)."""
        return cls(as_completion({"role": "assistant", "content": text}))

    def holds(self) -> Holds:
        """What it holds beside the text the check reads."""
        return Holds(tuple(answers.unreadable(self.completion)), answers.has_tool_calls(self.completion))


@dataclass(frozen=True)
class Found:
    """What the check found in an answer, and how long it took; `error`: a failed check's error, for the log
    (secrets masked)."""

    finding: Finding
    latency_ms: float = 0.0
    error: str = ""


@dataclass(frozen=True)
class CheckOutcome:
    """Policy's one decision on an answer, with the detection it was made from."""

    decision: Decision
    detection: Detection | None
    latency_ms: float

    def record(self, request: CheckRequest, *, answer: str, regenerations: int = 0,
               trace_id: str | None = None) -> DecisionRecord:
        rag = request.rag
        return DecisionRecord.of_check(
            request_id=request.request_id, decision=self.decision, detection=self.detection,
            latency_ms=self.latency_ms, regenerations=regenerations, trace_id=trace_id,
            context_source=request.source, route=request.route or None, model=request.model,
            question=rag.question if rag else None, answer=answer,
            context="\n\n".join(rag.passages) if rag else None, gateway=request.gateway)


@dataclass(frozen=True)
class Settled:
    """An answer as the guard left it (the action carried out; in the API's shape where it has one), and the
    record of its decision."""

    answer: Answer
    record: DecisionRecord


# What a gateway is told of an answer (`DecisionRecord.gateway` records it as `<gateway>:<told>`).
DENY, PASS, FAILED = "deny", "pass", "failed"
TOO_MANY = "too_many_choices"  # the reason of the one row of the choices past `proxy.max_choices`


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


def label(gateway: str | None, told: str) -> str | None:
    return f"{gateway}:{told}" if gateway else None
