"""Where in the answer a factoid came from: character offsets, found exactly or by fuzzy alignment."""

from __future__ import annotations

import re

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
