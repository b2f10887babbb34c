"""Cheap front ends for a fast check: an answer's statements without an LLM, and the part of the context
they are about.

On the embedded judge reading is the cost that remains once generation is cut down: every context token
is computed once per check at ~100 tokens/s on two cores. A check that sends only the context sentences
sharing rare words with the answer reads a fraction of the context and loses little, since a sentence
that shares no content word with a statement can rarely confirm or refute it.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass

from morphguard.detectors.spans import content_words, sentences

# Sentence ends: . ! ? followed by a space (so "3.5" and "U.S." inside words stay whole), and line breaks.
_BREAK = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[]?[A-Z0-9*•-])|\n+")
_BULLET = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+")
# Words that talk about the retrieval rather than the world: a sentence made only of them states no fact.
_META = frozenset(
    "based provided passage passages context information given question answer answers mentioned according "
    "summary overall therefore however confidently confident sure help hope following here below above".split()
)


def statements(answer: str, limit: int = 16) -> list[str]:
    """The answer's sentences and list items that state something, in order, as written.

    Dropped: intros ending in a colon ("Based on the passages, the reasons are:") and sentences whose
    content words all talk about the passages or the answering itself.
    """
    out = [text for text in pieces(answer) if not text.endswith(":") and len(content_words(text) - _META) >= 2]
    return out[:limit]


def pieces(answer: str) -> list[str]:
    """The answer's sentences and list items, as written, without a list item's marker."""
    return [text for piece in _BREAK.split(answer) if (text := _BULLET.sub("", piece).strip())]


def about_the_sources(text: str) -> bool:
    """Whether every content word of `text` talks about the passages or the answering ("Based on the passages:").
    A bare "No." has no content word, and so says something."""
    words = content_words(text)
    return bool(words) and words <= _META


@dataclass(frozen=True)
class _Sentence:
    passage: int
    order: int
    text: str
    words: frozenset[str]


def focus(claims: list[str], passages: list[str], budget: int) -> list[str]:
    """The passages cut down to the sentences most relevant to `claims`, at most `budget` characters in all.

    Every claim first gets its best-matching sentences (words weighted by rarity in the context), then the
    rest by relevance while room is left. Kept sentences stay in context order; a gap is marked " … ", and
    a passage with nothing kept becomes empty so numbering is unchanged. Contexts within budget (or a budget
    of 0) are returned whole.
    """
    if budget <= 0 or sum(len(p) for p in passages) <= budget:
        return list(passages)
    pool = [_Sentence(n, i, passage[s:e], frozenset(content_words(passage[s:e])))
            for n, passage in enumerate(passages) for i, (s, e) in enumerate(sentences(passage))]
    df = Counter(word for sentence in pool for word in sentence.words)
    idf = {w: math.log(1 + len(pool) / d) for w, d in df.items()}

    best_rank = [math.inf] * len(pool)
    best_score = [0.0] * len(pool)
    for claim in claims:
        wanted = content_words(claim)
        # fsum: exact, so a tie stays a tie whatever order the process's hash seed gives the set
        scores = [math.fsum(idf[w] for w in wanted & s.words) for s in pool]
        ranked = sorted((i for i in range(len(pool)) if scores[i] > 0), key=lambda i: -scores[i])
        for rank, i in enumerate(ranked):
            best_rank[i] = min(best_rank[i], rank)
            best_score[i] = max(best_score[i], scores[i])

    chosen: set[int] = set()
    room = budget
    for i in sorted(range(len(pool)), key=lambda i: (best_rank[i], -best_score[i])):
        if best_score[i] > 0 and len(pool[i].text) + 1 <= room:
            chosen.add(i)
            room -= len(pool[i].text) + 1

    out = []
    for n in range(len(passages)):
        kept = [(s.order, s.text) for i, s in enumerate(pool) if s.passage == n and i in chosen]
        text = ""
        previous = -1  # the order of the sentence kept before; a jump is a gap
        for order, sentence in kept:
            joint = " " if text else ""
            text += (joint + "… " if order != previous + 1 else joint) + sentence
            previous = order
        out.append(text)
    return out
