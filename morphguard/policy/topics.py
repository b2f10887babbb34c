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
    """One alternation for all keywords of a topic (one pass over the text), plus the configured regexes."""
    words = [re.escape(k.strip()).replace(r"\*", r"[\w-]*") for k in rule.keywords if k.strip()]  # `*`: any ending
    patterns = [re.compile(rf"\b(?:{'|'.join(words)})\b", re.I)] if words else []
    patterns += [re.compile(p, re.I) for p in rule.patterns]
    return patterns


class TopicTagger:
    """Reads the question and at most `scan_chars` characters of the context, so tagging a 4 MB context
    costs no more than tagging a short one."""

    def __init__(self, rules: Mapping[str, TopicRule], scan_chars: int = 20_000) -> None:
        self._patterns = {topic: _compile(rule) for topic, rule in rules.items()}
        self.scan_chars = scan_chars

    def topics(self, text: str) -> list[str]:
        """Every topic with at least one match, the most-matched first (ties in configuration order)."""
        hits = {topic: sum(len(p.findall(text)) for p in patterns) for topic, patterns in self._patterns.items()}
        return sorted((t for t, n in hits.items() if n), key=lambda t: -hits[t])

    def tag(self, rag: RagInput) -> list[str]:
        context = "\n".join(rag.passages)[:self.scan_chars]
        return self.topics(rag.question[:self.scan_chars] + "\n" + context)
