"""What a benchmark item is: a question, its context, an answer and its labels. Every dataset reader
(`datasets`) and builder (`contrast`) makes these."""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator


class Span(BaseModel):
    start: int = Field(ge=0)
    end: int = Field(ge=0)


class Item(BaseModel):
    id: str
    task: str
    question: str
    passages: list[str]
    answer: str
    hallucinated: bool
    spans: list[Span] | None = None  # None: the dataset has no span labels for this item
    # Items that share a source (RAGTruth: one context answered by six models; a contrast pair) share a group,
    # and a group is never split between the fit and the report half. None: the item is its own group.
    group: str | None = None
    topic: str | None = None  # the policy topic, where the source recorded one (reviews); else the tagger's

    @field_validator("passages", mode="before")
    @classmethod
    def _passages(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value
