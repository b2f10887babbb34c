"""A rule-based topic tagger: configured keywords and regexes over the conversation and the context.

Topics describe the subject of the exchange, never the person asking: nothing about the user is
inferred or kept.

What is read: the question, every turn of the conversation the client sent (`RagInput.turns`: a subject
stated three messages back is still the subject) and the whole context, with no cap a keyword could be
pushed past. Keywords are matched on the folded text (`morphguard.folding.foldings`: format characters,
look-alike letters, compatibility forms, accents and case written one way), so "preg\u200bnant", "prеgnаnt"
with Cyrillic letters and fullwidth "ｐｒｅｇｎａｎｔ" are all "pregnant". The work is linear in what is read:
one fold, then one pass per topic of a regex of literal alternatives that cannot backtrack past the word it
is in (about 0.1 s per MB of text with the default topics; the request body's limit bounds the text). What a
string match cannot see (a paraphrase, a misspelling, another language the keywords do not cover) is the
detector's and the keywords' business, not this module's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from morphguard.config import TopicRule
from morphguard.folding import fold, foldings
from morphguard.models import RagInput


def keyword_regex(keywords: list[str]) -> str | None:
    """One alternation for a topic's keywords, over folded text: whole words, `*` = any ending (letters,
    digits, hyphens), a space = any run of white space."""
    words = []
    for keyword in keywords:
        parts = fold(keyword).split()
        if parts:
            words.append(r"\s+".join(re.escape(p).replace(r"\*", r"[\w-]*") for p in parts))
    return rf"\b(?:{'|'.join(words)})\b" if words else None


class TopicTagger:
    def __init__(self, rules: Mapping[str, TopicRule]) -> None:
        self._keywords = {topic: re.compile(regex) for topic, rule in rules.items()
                          if (regex := keyword_regex(rule.keywords))}
        # The operator's own regexes see the text as sent and folded (case-insensitively): one written for
        # either form still matches.
        self._patterns = {topic: [re.compile(p, re.I) for p in rule.patterns] for topic, rule in rules.items()}
        self._order = list(rules)

    def topics(self, text: str) -> list[str]:
        """Every topic with at least one match, the most-matched first (ties in configuration order)."""
        readings = foldings(text)  # one, or two for the few letters whose capital and small forms differ
        hits: dict[str, int] = {}
        for topic in self._order:
            keyword = self._keywords.get(topic)
            count = max(_count(keyword, r) for r in readings) if keyword is not None else 0
            for pattern in self._patterns[topic]:
                count += max(_count(pattern, r) for r in (text, *readings))
            if count:
                hits[topic] = count
        return sorted(hits, key=lambda t: -hits[t])

    def tag(self, rag: RagInput) -> list[str]:
        """The topics of the conversation (the question alone when no turns are given: the turns hold the
        question's message) and the whole context."""
        return self.topics("\n".join([*(rag.turns or [rag.question]), *rag.passages]))


def _count(pattern: re.Pattern[str], text: str) -> int:
    return sum(1 for _ in pattern.finditer(text))
