"""Shared data types: what goes into a check and what comes out of it."""

from __future__ import annotations

import warnings
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from morphguard.config import Action


def utf8(text: str) -> str:
    """`text` with any lone surrogate (JSON escapes can carry one; UTF-8 cannot) replaced by U+FFFD, so
    a judge call never fails on it: a failed check must not be something a client can cause."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


class RagInput(BaseModel):
    """One retrieval-augmented exchange to check: the question, the passages it was answered from."""

    question: str
    passages: list[str]
    # The conversation as the client sent it (the text of every message but the system and developer ones,
    # tagged blocks included, the question's message too), read by the topic tagger only: a subject stated in an
    # earlier turn is still the subject. Not checked against and not serialised: the topic is chosen before a
    # check is queued.
    turns: list[str] = Field(default_factory=list, exclude=True)

    @field_validator("question")
    @classmethod
    def _valid_question(cls, value: str) -> str:
        return utf8(value)

    @field_validator("passages")
    @classmethod
    def _valid_passages(cls, value: list[str]) -> list[str]:
        return [utf8(p) for p in value]

    def size(self, answer: str = "") -> int:
        """How much text a check of `answer` reads, in characters: the answer, the passages and the question."""
        return len(answer) + len(self.question) + sum(map(len, self.passages))


class Judgment(StrEnum):
    """What a judge says about one statement, given the passages. (A verdict is what a client is told of a whole
    answer: the `morphguard` object.)"""

    YES = "YES"  # entailed by the passages
    NO = "NO"  # contradicted by the passages
    NOT_SURE = "NOT SURE"  # the passages do not settle it


class VariantKind(StrEnum):
    """The metamorphic relation that produced a variant of a factoid."""

    SYNONYM = "synonym"  # same meaning: should be entailed
    ANTONYM = "antonym"  # opposite meaning: should be contradicted
    IDENTITY = "identity"  # the factoid itself (optional relation, scored like a synonym)


class Variant(BaseModel):
    kind: VariantKind
    text: str
    verdict: Judgment  # the field keeps its name in stored and returned detections
    reason: str = ""
    penalty: float
    # P(YES), P(NO), P(NOT SURE) when the verifier returned log-probabilities (soft verdicts).
    probabilities: dict[str, float] | None = None
    verifier: str = ""
    parsed: bool = True  # False: the verifier's output was unreadable and counted as NOT SURE


class Evidence(BaseModel):
    """A piece of the context that bears on a factoid: passage number (1-based) and offsets in that passage."""

    passage: int
    start: int
    end: int
    text: str


Label = Literal["supported", "unsupported", "contradicted"]


class Factoid(BaseModel):
    text: str
    # Character offsets of the answer text this factoid came from; None when it cannot be placed.
    start: int | None = None
    end: int | None = None
    score: float
    label: Label | None = None  # what the context says of it, where the detector can tell
    evidence: list[Evidence] = Field(default_factory=list)  # context that supports or refutes it
    reason: str = ""  # why the check scored it so, in a reviewer's words (the words the context lacks, ...)
    variants: list[Variant] = Field(default_factory=list)


class StageCost(BaseModel):
    llm_calls: int = 0
    cached_calls: int = 0  # replies reused from a cache of our own: no call made
    input_tokens: int = 0
    cached_input_tokens: int = 0  # of `input_tokens`, those the provider's prompt cache served
    output_tokens: int = 0
    seconds: float = 0.0

    def count(self, completion: Any) -> None:
        """Add one LLM reply (anything with `cached`, `input_tokens`, `output_tokens`, optionally
        `cached_input_tokens`)."""
        if completion.cached:
            self.cached_calls += 1
        else:
            self.llm_calls += 1
            self.input_tokens += completion.input_tokens
            self.cached_input_tokens += getattr(completion, "cached_input_tokens", 0)
            self.output_tokens += completion.output_tokens


class Cost(StageCost):
    """What one check cost in total, and per stage (decompose, mutate, verify)."""

    stages: dict[str, StageCost] = Field(default_factory=dict)

    @classmethod
    def of(cls, stages: dict[str, StageCost], seconds: float) -> Cost:
        """The stages added up; `seconds` is the check's wall time (stages may overlap)."""
        return cls(**{k: sum(getattr(s, k) for s in stages.values())
                      for k in ("llm_calls", "cached_calls", "input_tokens", "cached_input_tokens",
                                "output_tokens")},
                   seconds=seconds, stages=stages)


class DetectionStats(BaseModel):
    factoids: int = 0
    variants: int = 0
    unparseable_verdicts: int = 0
    unparseable_mutations: int = 0
    downgraded_claims: int = 0  # "supported" claims whose evidence phrase is not in the context


class Detection(BaseModel):
    """What a detector finds in one answer: H (the highest factoid score), the threshold and the evidence."""

    detector: str
    score: float
    threshold: float
    flagged: bool
    factoids: list[Factoid] = Field(default_factory=list)
    cost: Cost = Field(default_factory=Cost)
    stats: DetectionStats = Field(default_factory=DetectionStats)
    settings: dict[str, object] = Field(default_factory=dict)
    features: dict[str, float] = Field(default_factory=dict)  # numeric signals a combined check can learn from
    # Where the answer's text the check did not read begins: past a cap (`detector.max_judge_calls`,
    # `max_text_chars`) a check reads the answer's first sentences and decides on them. None: it read all of it.
    unchecked_from: int | None = None


class Decision(BaseModel):
    """What policy makes of a check: the profile and topic that applied, their threshold, the action."""

    profile: str
    topic: str  # "general" when no configured topic matched
    threshold: float
    flagged: bool
    action: Action
    escalate: bool = False
    safe_message: str = ""
    reason: str | None = None  # set when the answer was not checked: no_context, fail_open: ..., fail_closed: ...
    unchecked: bool = False  # the answer was due a check that could not decide, and goes out (`fail_open`)


def __getattr__(name: str) -> Any:
    if name == "Verdict":
        warnings.warn("morphguard.models.Verdict is deprecated; use Judgment (the judge's YES / NO / NOT SURE)",
                      DeprecationWarning, stacklevel=2)
        return Judgment
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
