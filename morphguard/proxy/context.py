"""Where the retrieved context of a chat request comes from (first configured source that has some):

1. explicit: the body field `morphguard.context` (a string or a list of strings); the whole
   `morphguard` object is removed before the body goes upstream;
2. tool: the content of `role: "tool"` messages (agentic RAG);
3. tags: `<context>…</context>`-style blocks (and configured regexes) in system and user messages.

The question is the last user message with any tagged blocks removed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from morphguard.config import ContextSettings
from morphguard.models import RagInput

OUR_FIELD = "morphguard"


@dataclass
class Extraction:
    body: dict[str, Any]  # what goes upstream: the request without our own field
    rag: RagInput | None  # None: no context found, the answer is not checked
    source: str | None = None
    options: dict[str, Any] = field(default_factory=dict)  # topic, policy, ... from `morphguard`


def _text(content: Any) -> str:
    """A message's text: a string, or the text parts of a content array."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


class ContextExtractor:
    def __init__(self, settings: ContextSettings) -> None:
        self.sources = settings.sources
        tag_names = "|".join(re.escape(t) for t in settings.tags)
        self.patterns = [re.compile(rf"<({tag_names})(?:\s[^>]*)?>(.*?)</\1\s*>", re.S | re.I)] if tag_names else []
        self.patterns += [re.compile(p, re.S) for p in settings.patterns]

    def extract(self, body: dict[str, Any]) -> Extraction:
        ours = body.get(OUR_FIELD)
        forwarded = {k: v for k, v in body.items() if k != OUR_FIELD}
        options = {k: v for k, v in ours.items() if k != "context"} if isinstance(ours, dict) else {}
        messages = [m for m in body.get("messages", []) if isinstance(m, dict)]
        question = self._question(messages)
        for source in self.sources:
            passages = getattr(self, f"_{source}")(ours, messages)
            if passages:
                return Extraction(forwarded, RagInput(question=question, passages=passages), source, options)
        return Extraction(forwarded, None, None, options)

    def _explicit(self, ours: Any, messages: list[dict[str, Any]]) -> list[str]:
        context = ours.get("context") if isinstance(ours, dict) else None
        if isinstance(context, str):
            context = [context]
        return [p for p in context if isinstance(p, str) and p.strip()] if isinstance(context, list) else []

    def _tool(self, ours: Any, messages: list[dict[str, Any]]) -> list[str]:
        return [t for m in messages if m.get("role") == "tool" and (t := _text(m.get("content")).strip())]

    def _tags(self, ours: Any, messages: list[dict[str, Any]]) -> list[str]:
        passages = []
        for message in messages:
            if message.get("role") in ("system", "user"):
                for pattern in self.patterns:
                    for match in pattern.finditer(_text(message.get("content"))):
                        text = match.group(match.lastindex or 0) if pattern.groups else match.group(0)
                        if text.strip():
                            passages.append(text.strip())
        return passages

    def _question(self, messages: list[dict[str, Any]]) -> str:
        for message in reversed(messages):
            if message.get("role") == "user":
                text = _text(message.get("content"))
                for pattern in self.patterns:
                    text = pattern.sub("", text)
                return text.strip()
        return ""
