"""Where in the answer a factoid came from: character offsets, found exactly or by fuzzy alignment."""

from __future__ import annotations

import re
from collections.abc import Sequence

from morphguard.models import Evidence

_WORD = re.compile(r"\w+(?:[-'’]\w+)*", re.UNICODE)
_SENTENCE = re.compile(r"[^.!?;\n]+[.!?;]*", re.UNICODE)
_STOPWORDS = frozenset(
    "a an the and or of to in on at for by with from as is are was were be been being it its this that these those "
    "which who whom whose there their they them he she his her we our you your i me my not no do does did has have had "
    "can could will would should may might must also than then so if but".split()
)


def content_words(text: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(text) if w.lower() not in _STOPWORDS}


def locate(factoid: str, answer: str, min_overlap: float = 0.4) -> tuple[int, int] | None:
    """The (start, end) of the answer text a factoid restates, or None when nothing matches well enough.

    An exact (case-insensitive) occurrence wins. Otherwise the answer sentence sharing the largest share
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
    for sentence in _SENTENCE.finditer(answer):
        shared = wanted & content_words(sentence.group())
        overlap = len(shared) / len(wanted)
        if overlap >= min_overlap and (best is None or overlap > best[0]):
            hits = [m for m in _WORD.finditer(sentence.group()) if m.group().lower() in shared]
            best = (overlap, sentence.start() + hits[0].start(), sentence.start() + hits[-1].end())
    return (best[1], best[2]) if best else None


# A sentence ends at . ! ? followed by white space (so "3.5" and "U.S.-based" stay whole) or at a line
# break; a list marker ("5." or "5)" opening a line) belongs to the item it numbers.
_SENTENCE_END = re.compile(r"[.!?]+[\"')\]]*(?=\s)|\n")
_LIST_MARKER = re.compile(r"\s*(?:\d{1,3}[.)]|[-*•])\s*")


def sentence_ends(text: str, start: int = 0) -> list[int]:
    """Where each finished sentence of `text[start:]` ends (a sentence begins at `start`). An end needs the
    white space after it, so the ends found in a text are still its ends once more text is appended: a stream
    can be cut into sentences as it arrives."""
    ends = []
    for match in _SENTENCE_END.finditer(text, start):
        if not _LIST_MARKER.fullmatch(text, start, match.end()):
            ends.append(match.end())
            start = match.end()
    return ends


def sentences(text: str) -> list[tuple[int, int]]:
    """(start, end) of each sentence of `text`, stripped of surrounding spaces."""
    bounds = [0, *sentence_ends(text)]
    cuts = list(zip(bounds, bounds[1:], strict=False))
    cuts.append((bounds[-1], len(text)))
    out = []
    for start, end in cuts:
        raw = text[start:end]
        start, end = start + len(raw) - len(raw.lstrip()), end - (len(raw) - len(raw.rstrip()))
        if end > start:
            out.append((start, end))
    return out


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
    words = phrase.split()
    if not words:
        return None
    pattern = re.compile(r"\s+".join(re.escape(w) for w in words), re.I)
    for number, passage in enumerate(passages, 1):
        match = pattern.search(passage)
        if match:
            return Evidence(passage=number, start=match.start(), end=match.end(), text=match.group())
    return None
