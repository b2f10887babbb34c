"""Where in the answer a factoid came from: character offsets, found exactly or by fuzzy alignment."""

from __future__ import annotations

import re
from collections.abc import Sequence

from morphguard.detectors.text import CLAUSE, RELEVANCE_WORD, content_words, sentences
from morphguard.models import Evidence


def locate(factoid: str, answer: str, min_overlap: float = 0.4) -> tuple[int, int] | None:
    """The (start, end) of the answer text a factoid restates, or None when nothing matches well enough.

    An exact (case-insensitive) occurrence wins. Otherwise the answer clause (`text.CLAUSE`) sharing the largest share
    of the factoid's content words is chosen, and the span is narrowed to the first and last shared word.
    """
    needle = factoid.strip().rstrip(".!?").strip()
    if needle:
        at = answer.lower().find(needle.lower())
        if at >= 0:
            return at, at + len(needle)
    wanted = content_words(factoid)
    if not wanted:
        return None
    best: tuple[float, int, int] | None = None
    for clause in CLAUSE.finditer(answer):
        shared = wanted & content_words(clause.group())
        overlap = len(shared) / len(wanted)
        if overlap >= min_overlap and (best is None or overlap > best[0]):
            hits = [m for m in RELEVANCE_WORD.finditer(clause.group()) if m.group().lower() in shared]
            best = (overlap, clause.start() + hits[0].start(), clause.start() + hits[-1].end())
    return (best[1], best[2]) if best else None


def align_evidence(statement: str, passages: list[str]) -> Evidence | None:
    """The context sentence sharing most content words with the statement (at least two, or half of them)."""
    return evidence_for([statement], passages)[0]


def evidence_for(statements: Sequence[str], passages: Sequence[str]) -> list[Evidence | None]:
    """`align_evidence` for each statement, the context read once: the work is the context's length times the
    number of statements, so a caller bounds the latter."""
    context = [(number, start, end, passage[start:end], content_words(passage[start:end]))
               for number, passage in enumerate(passages, 1) for start, end in sentences(passage)]
    found: list[Evidence | None] = []
    for statement in statements:
        wanted = content_words(statement)
        best: tuple[float, int] | None = None
        for at, (_, _, _, _, words) in enumerate(context):
            shared = len(wanted & words)
            share = shared / len(wanted) if wanted else 0.0
            if (shared >= 2 or share >= 0.5) and (best is None or share > best[0]):
                best = (share, at)
        if best is None:
            found.append(None)
        else:
            number, start, end, text, _ = context[best[1]]
            found.append(Evidence(passage=number, start=start, end=end, text=text))
    return found


def find_phrase(phrase: str, passages: list[str]) -> Evidence | None:
    """Where a quoted phrase occurs in the context, ignoring case and runs of whitespace; None if nowhere."""
    for number, passage in enumerate(passages, 1):
        found = occurrence(phrase, passage)
        if found:
            start, end = found
            return Evidence(passage=number, start=start, end=end, text=passage[start:end])
    return None


def occurrence(phrase: str, text: str) -> tuple[int, int] | None:
    """The (start, end) of the first place a quoted phrase occurs in the text, ignoring case and runs of whitespace
    (a judge that quotes a line break as a space still quotes it); None if nowhere or the phrase is blank."""
    words = phrase.split()
    if not words:
        return None
    match = re.search(r"\s+".join(re.escape(w) for w in words), text, re.I)
    return (match.start(), match.end()) if match else None
