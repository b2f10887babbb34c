"""A rule-based topic tagger: configured keywords and regexes over the question and the context.

Topics describe the subject of the exchange, never the person asking: nothing about the user is
inferred or kept.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from morphguard.config import TopicRule
from morphguard.models import RagInput


def _compile(rule: TopicRule) -> list[re.Pattern[str]]:
    patterns = []
    for keyword in rule.keywords:
        body = re.escape(keyword.strip()).replace(r"\*", r"[\w-]*")  # `*`: any word ending
        patterns.append(re.compile(rf"\b{body}\b", re.I))
    patterns += [re.compile(p, re.I) for p in rule.patterns]
    return patterns


class TopicTagger:
    def __init__(self, rules: Mapping[str, TopicRule]) -> None:
        self._patterns = {topic: _compile(rule) for topic, rule in rules.items()}

    def topics(self, text: str) -> list[str]:
        """Every topic with at least one match, the most-matched first (ties in configuration order)."""
        hits = {topic: sum(len(p.findall(text)) for p in patterns) for topic, patterns in self._patterns.items()}
        return sorted((t for t, n in hits.items() if n), key=lambda t: -hits[t])

    def tag(self, rag: RagInput) -> list[str]:
        return self.topics("\n".join([rag.question, *rag.passages]))
