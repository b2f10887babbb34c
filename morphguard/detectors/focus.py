"""The part of the context a fast check sends: the sentences most relevant to the claims it asks about.

On the embedded judge reading is the cost that remains once generation is cut down: every context token
is computed once per check at ~100 tokens/s on two cores. A check that sends only the context sentences
sharing rare words with the answer reads a fraction of the context and loses little, since a sentence
that shares no content word with a statement can rarely confirm or refute it.

`Focus` reads a context once (its sentences, each word's rarity, which sentences hold it) for the many
selections a check makes of it: a claim is scored only against the sentences sharing a word with it, its rarest
words first and at most `CANDIDATES` sentences, so the work grows with the context and the claims, not with their
product.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from functools import cached_property

from morphguard.detectors.text import content_words, sentences

CANDIDATES = 2_000  # the most context sentences one claim is scored against (`Focus._candidates`)


@dataclass(frozen=True)
class _Sentence:
    passage: int
    order: int
    text: str
    words: frozenset[str]
    start: int  # where it is in its passage
    end: int


class Focus:
    """A context indexed for `select`: built once, however many selections a check makes of it."""

    def __init__(self, passages: list[str]) -> None:
        self.passages = list(passages)
        self.size = sum(len(p) for p in passages)

    @cached_property
    def pool(self) -> list[_Sentence]:
        """The context's sentences, read only for a context beyond a selection's budget."""
        return [_Sentence(n, i, passage[s:e], frozenset(content_words(passage[s:e])), s, e)
                for n, passage in enumerate(self.passages) for i, (s, e) in enumerate(sentences(passage))]

    @cached_property
    def idf(self) -> dict[str, float]:
        df = Counter(word for sentence in self.pool for word in sentence.words)
        return {w: math.log(1 + len(self.pool) / d) for w, d in df.items()}

    @cached_property
    def holding(self) -> dict[str, list[int]]:
        """Each word's sentences, in context order."""
        holding: dict[str, list[int]] = {}
        for i, sentence in enumerate(self.pool):
            for word in sentence.words:
                holding.setdefault(word, []).append(i)
        return holding

    def _candidates(self, wanted: set[str] | frozenset[str]) -> set[int]:
        """The sentences a claim is scored against: those holding its words, rarest word first, until adding the next
        word's would pass `CANDIDATES` (the rarest word's first ones at least). A word most sentences hold ranks
        little, and a claim made of common words would otherwise be scored against the whole context: with
        thousands of claims, the square of the length."""
        held = sorted((w for w in wanted if w in self.holding), key=lambda w: (len(self.holding[w]), w))
        found: set[int] = set()
        for word in held:
            sentences_holding = self.holding[word]
            if found and len(found) + len(sentences_holding) > CANDIDATES:
                break
            found.update(sentences_holding[:CANDIDATES])
        return found

    def select(self, claims: list[str], budget: int) -> list[str]:
        """The passages cut down to the sentences most relevant to `claims`, at most `budget` characters in all
        (`focus`)."""
        if budget <= 0 or self.size <= budget:
            return list(self.passages)
        pool = self.pool
        kept: list[list[_Sentence]] = [[] for _ in self.passages]
        for i in self.chosen(claims, budget):
            kept[pool[i].passage].append(pool[i])
        out = []
        for sentences_kept in kept:
            parts: list[str] = []
            previous = -1  # the order of the sentence kept before; a jump is a gap
            for sentence in sentences_kept:
                joint = " " if parts else ""
                parts.append((joint + "… " if sentence.order != previous + 1 else joint) + sentence.text)
                previous = sentence.order
            out.append("".join(parts))
        return out

    def chosen(self, claims: list[str], budget: int) -> list[int]:
        """The places in `pool` of the sentences `select` keeps, in context order (every one within the budget)."""
        if budget <= 0 or self.size <= budget:
            return list(range(len(self.pool)))
        pool, idf = self.pool, self.idf
        best_rank: dict[int, float] = {}
        best_score: dict[int, float] = {}
        for claim in claims:
            wanted = content_words(claim)
            candidates = sorted(self._candidates(wanted))
            # fsum: exact, so a tie stays a tie whatever order the process's hash seed gives the set
            scores = {i: math.fsum(idf[w] for w in wanted & pool[i].words) for i in candidates}
            ranked = sorted((i for i in candidates if scores[i] > 0), key=lambda i: -scores[i])
            for rank, i in enumerate(ranked):
                best_rank[i] = min(best_rank.get(i, math.inf), rank)
                best_score[i] = max(best_score.get(i, 0.0), scores[i])

        chosen: set[int] = set()
        room = budget
        for i in sorted(best_score, key=lambda i: (best_rank[i], -best_score[i], i)):
            if best_score[i] > 0 and len(pool[i].text) + 1 <= room:
                chosen.add(i)
                room -= len(pool[i].text) + 1
        return sorted(chosen)


def focus(claims: list[str], passages: list[str], budget: int) -> list[str]:
    """The passages cut down to the sentences most relevant to `claims`, at most `budget` characters in all.

    Every claim first gets its best-matching sentences (words weighted by rarity in the context), then the
    rest by relevance while room is left. Kept sentences stay in context order; a gap is marked " … ", and
    a passage with nothing kept becomes empty so numbering is unchanged. Contexts within budget (or a budget
    of 0) are returned whole.
    """
    return Focus(passages).select(claims, budget)


def within(question: str, passages: list[str], answer: str, limit: int) -> tuple[list[str], int]:
    """What one check of `answer` reads within `limit` characters of answer, question and passages: the answer's
    first sentences (those ending within what the context leaves, at least half the limit) and the passages cut to
    the sentences most relevant to them. The passages it reads, and where the answer read ends (0: not one sentence
    fits)."""
    context = len(question) + sum(map(len, passages))
    room = max(limit - context, limit // 2)
    read = 0
    for _, end in sentences(answer):
        if end > room:
            break
        read = end
    left = limit - len(question) - read
    if context - len(question) > left:
        # a gap's " … " is not counted by `select`: a tenth of the room is left for them
        passages = Focus(passages).select([answer[s:e] for s, e in sentences(answer[:read])], max(1, left * 9 // 10))
    return passages, read
