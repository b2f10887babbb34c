"""The part of the context a fast check sends: the sentences most relevant to the claims it asks about.

On the embedded judge reading is the cost that remains once generation is cut down: every context token
is computed once per check at ~100 tokens/s on two cores. A check that sends only the context sentences
sharing rare words with the answer reads a fraction of the context and loses little, since a sentence
that shares no content word with a statement can rarely confirm or refute it.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from morphguard.detectors.text import content_words, sentences


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
