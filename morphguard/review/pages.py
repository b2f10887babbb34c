"""What the detail page shows, as plain data for the templates: the answer cut into pieces with the
flagged factoids marked, and the passages cut into pieces with the sentences that bear on them marked.
No HTML is built here: the templates escape every piece (answers and passages are untrusted)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from morphguard.detectors.spans import evidence_for

# The most flagged factoids whose evidence a page marks in the passages: each is looked up over the whole context,
# and a hostile answer can carry thousands. The answer itself still marks every one.
MAX_MARKED = 50


@dataclass(frozen=True)
class Piece:
    text: str
    factoid: int | None = None  # 1-based number of the flagged factoid this piece belongs to
    score: float | None = None


def answer_pieces(answer: str, factoids: list[dict[str, Any]]) -> list[Piece]:
    """The answer in order, flagged factoids' spans as marked pieces (overlaps go to the earlier factoid)."""
    spans = sorted((f["start"], f["end"], n, f["score"]) for n, f in enumerate(factoids, 1)
                   if f.get("flagged") and f.get("start") is not None and f.get("end") is not None
                   and 0 <= f["start"] < f["end"] <= len(answer))
    pieces, cursor = [], 0
    for start, end, number, score in spans:
        if start < cursor:
            start = cursor
        if start >= end:
            continue
        if start > cursor:
            pieces.append(Piece(answer[cursor:start]))
        pieces.append(Piece(answer[start:end], number, score))
        cursor = end
    if cursor < len(answer):
        pieces.append(Piece(answer[cursor:]))
    return pieces


def passages_of(context: str | None) -> list[str]:
    """The passages as the proxy joined them into the audit row (blank-line separated)."""
    return [p for p in (context or "").split("\n\n") if p.strip()]


def passage_pieces(passages: list[str], factoids: list[dict[str, Any]]) -> list[list[Piece]]:
    """Per passage, its text with the sentence closest to each flagged factoid (the first `MAX_MARKED`) marked with
    that factoid's number: the evidence a reviewer compares the claim with."""
    flagged = [(number, f) for number, f in enumerate(factoids, 1) if f.get("flagged")][:MAX_MARKED]
    marks: dict[int, list[tuple[int, int, int]]] = {}
    for (number, _), evidence in zip(flagged, evidence_for([f["text"] for _, f in flagged], passages), strict=True):
        if evidence is not None:
            marks.setdefault(evidence.passage - 1, []).append((evidence.start, evidence.end, number))
    out = []
    for index, passage in enumerate(passages):
        pieces, cursor = [], 0
        for start, end, number in sorted(marks.get(index, [])):
            if start < cursor:
                continue  # the same sentence for two factoids: marked once, for the first
            if start > cursor:
                pieces.append(Piece(passage[cursor:start]))
            pieces.append(Piece(passage[start:end], number))
            cursor = end
        if cursor < len(passage):
            pieces.append(Piece(passage[cursor:]))
        out.append(pieces)
    return out
