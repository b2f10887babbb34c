"""What the detail page shows, as plain data for the templates: the answer's claims (the factoids of every
detector part merged per span of the answer), each with the reasons the check gave and the passage sentence it
is weighed against, and the answer cut into pieces with the flagged claims marked. No HTML is built here: the
templates escape every piece (answers and passages are untrusted)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from morphguard.detectors.spans import evidence_for

# The most claims whose evidence a page looks up: each lookup reads the whole context, and a hostile answer can
# carry thousands of flagged factoids. The answer itself still marks every one.
MAX_MARKED = 50
_AROUND = 160  # characters of the passage shown on each side of the evidence sentence
# What the context says of a claim, strongest first: a claim one part finds contradicted is contradicted.
_LABELS = ("contradicted", "unsupported", "supported")


@dataclass(frozen=True)
class Piece:
    text: str
    claim: int | None = None  # number of the flagged claim this piece belongs to
    score: float | None = None
    label: str | None = None


@dataclass(frozen=True)
class Evidence:
    """A passage sentence beside a claim, with a little of the passage around it."""

    passage: int  # 1-based
    start: int  # the sentence's offsets in its passage
    end: int
    before: str
    text: str
    after: str
    stored: bool  # the check named this sentence (else it is the closest sentence by shared words)


@dataclass
class Claim:
    number: int  # in answer order, from 1
    factoid: int  # number of its first factoid in the row: the key of a reviewer's label for it
    text: str
    start: int | None
    end: int | None
    score: float
    flagged: bool
    label: str | None = None
    reasons: list[str] = field(default_factory=list)
    places: list[tuple[int, int, int]] = field(default_factory=list)  # stored evidence: (passage, start, end)
    evidence: Evidence | None = None


def claims_of(answer: str, factoids: list[dict[str, Any]], flagged_answer: bool) -> list[Claim]:
    """One claim per stretch of the answer, however many detector parts named it (overlapping spans merge);
    factoids that cannot be placed are claims of their own, one per text. A claim is flagged when one of its
    factoids is, or when the answer is flagged and a part found the claim contradicted."""
    placed = sorted(((f["start"], f["end"], n, f) for n, f in enumerate(factoids, 1)
                     if _placed(f, len(answer))), key=lambda item: (item[0], item[1], item[2]))
    groups: list[list[tuple[int, dict[str, Any]]]] = []
    spans: list[list[int]] = []
    for start, end, number, factoid in placed:
        if spans and start < spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], end)
            groups[-1].append((number, factoid))
        else:
            spans.append([start, end])
            groups.append([(number, factoid)])
    loose: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for number, factoid in enumerate(factoids, 1):
        if not _placed(factoid, len(answer)):
            loose.setdefault(str(factoid.get("text", "")), []).append((number, factoid))
    claims = [_claim(answer[s:e], s, e, members, flagged_answer) for (s, e), members in zip(spans, groups, strict=True)]
    claims += [_claim(text, None, None, members, flagged_answer) for text, members in loose.items()]
    for number, claim in enumerate(claims, 1):
        claim.number = number
    return claims


def _placed(factoid: dict[str, Any], length: int) -> bool:
    start, end = factoid.get("start"), factoid.get("end")
    return isinstance(start, int) and isinstance(end, int) and 0 <= start < end <= length


def _claim(text: str, start: int | None, end: int | None, members: list[tuple[int, dict[str, Any]]],
           flagged_answer: bool) -> Claim:
    labels = {f.get("label") for _, f in members}
    label = next((lb for lb in _LABELS if lb in labels), None)
    flagged = any(f.get("flagged") for _, f in members) or (flagged_answer and label == "contradicted")
    reasons = list(dict.fromkeys(str(f["reason"]) for _, f in members if f.get("reason")))
    places = list(dict.fromkeys((int(e["passage"]), int(e["start"]), int(e["end"]))
                                for _, f in members for e in f.get("evidence") or []
                                if isinstance(e, dict) and {"passage", "start", "end"} <= e.keys()))
    return Claim(0, members[0][0], text, start, end, max(float(f.get("score") or 0.0) for _, f in members), flagged,
                 label, reasons, places)


def attach_evidence(claims: list[Claim], passages: list[str]) -> None:
    """Give the first `MAX_MARKED` flagged claims the passage sentence to read them against: the one the check
    named where it named one, else the sentence sharing most of the claim's words."""
    wanted = [c for c in claims if c.flagged][:MAX_MARKED]
    unnamed = [c for c in wanted if not _stored(c, passages)]
    for claim, found in zip(unnamed, evidence_for([c.text for c in unnamed], passages), strict=True):
        if found is not None:
            claim.evidence = _excerpt(passages, found.passage, found.start, found.end, stored=False)
    for claim in wanted:
        place = _stored(claim, passages)
        if place is not None:
            claim.evidence = _excerpt(passages, *place, stored=True)


def _stored(claim: Claim, passages: list[str]) -> tuple[int, int, int] | None:
    return next(((p, s, e) for p, s, e in claim.places
                 if 1 <= p <= len(passages) and 0 <= s < e <= len(passages[p - 1])), None)


def _excerpt(passages: list[str], passage: int, start: int, end: int, *, stored: bool) -> Evidence:
    text = passages[passage - 1]
    before, after = text[max(0, start - _AROUND):start], text[end:end + _AROUND]
    return Evidence(passage, start, end, ("…" if start > _AROUND else "") + before, text[start:end],
                    after + ("…" if end + _AROUND < len(text) else ""), stored)


def answer_pieces(answer: str, claims: list[Claim]) -> list[Piece]:
    """The answer in order, the flagged claims' spans as marked pieces (claims never overlap)."""
    pieces, cursor = [], 0
    for claim in claims:
        if not claim.flagged or claim.start is None or claim.end is None:
            continue
        if claim.start > cursor:
            pieces.append(Piece(answer[cursor:claim.start]))
        pieces.append(Piece(answer[claim.start:claim.end], claim.number, claim.score, claim.label))
        cursor = claim.end
    if cursor < len(answer):
        pieces.append(Piece(answer[cursor:]))
    return pieces


def passages_of(context: str | None) -> list[str]:
    """The passages as the proxy joined them into the audit row (blank-line separated)."""
    return [p for p in (context or "").split("\n\n") if p.strip()]


def passage_pieces(passages: list[str], claims: list[Claim]) -> list[list[Piece]]:
    """Per passage, its text with each claim's evidence sentence marked with that claim's number."""
    marks: dict[int, list[tuple[int, int, int]]] = {}
    for claim in claims:
        if claim.evidence is not None:
            e = claim.evidence
            marks.setdefault(e.passage - 1, []).append((e.start, e.end, claim.number))
    out = []
    for index, passage in enumerate(passages):
        pieces, cursor = [], 0
        for start, end, number in sorted(marks.get(index, [])):
            if start < cursor:
                continue  # the same sentence for two claims: marked once, for the first
            if start > cursor:
                pieces.append(Piece(passage[cursor:start]))
            pieces.append(Piece(passage[start:end], number))
            cursor = end
        if cursor < len(passage):
            pieces.append(Piece(passage[cursor:]))
        out.append(pieces)
    return out

