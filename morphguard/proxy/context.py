"""Where the retrieved context of a chat request comes from (first configured source that has some):

1. explicit: the body field `morphguard.context` (a string or a list of strings); the whole
   `morphguard` object is removed before the body goes upstream;
2. tool: the content of `role: "tool"` messages (agentic RAG);
3. tags: `<context>…</context>`-style blocks, NeMo Guardrails' own context block (below), and configured
   regexes, in the messages of `context.tag_roles`.

The question is the last user message with any tagged blocks removed. The topic tagger also reads the
whole conversation (`RagInput.turns`: every message but the system and developer ones, tagged blocks
included), so a subject cannot be hidden in an earlier turn or inside a block that is not context.

Trust: the explicit field and tool messages are written by the app; tags in a `user` message may have
been typed by the end user, which is why the roles that may carry tags are configurable. A retrieved
document is untrusted text and may itself contain `</context>`: that ends its block early (the rest of
the message is still scanned), so apps that cannot escape documents should use the explicit field.

Tag scanning is linear in the message length whatever the input (a backtracking regex over thousands
of unclosed tags took seconds): tags are found by one pass of a pattern that cannot cross a `<`, then
paired up; an unclosed block runs to the end of its message rather than silently vanishing.

NeMo Guardrails, when its main model is this proxy, sends its retrieved chunks (`$relevant_chunks`) inside its own
prompt, as its prompt templates write them: a heading line ("# This is some additional context:", or "This is
some relevant context:" in its `general` task) followed by a fenced block opened by "```markdown". `NemoBlocks`
reads those blocks in one forward pass: each heading is matched only where it stands, the closing fence is looked
for once from there on, and a block with no closing fence ends the scan (its text runs to the end).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from morphguard.config import ContextSettings
from morphguard.models import RagInput

OUR_FIELD = "morphguard"
_INSTRUCTIONS = frozenset({"system", "developer"})  # the app's own messages; every other role is the conversation


@dataclass
class Extraction:
    body: dict[str, Any]  # what goes upstream: the request without our own field
    rag: RagInput | None  # None: no context found, the answer is not checked
    source: str | None = None
    options: dict[str, Any] = field(default_factory=dict)  # topic, policy, ... from `morphguard`


def message_text(content: Any) -> str:
    """A message's text: a string, or the string `text` of the text parts of a content array."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content
                         if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str))
    return ""


class TagScanner:
    """Splits text into tagged blocks and the rest, in linear time."""

    def __init__(self, names: list[str]) -> None:
        alternatives = "|".join(re.escape(n) for n in names)
        # `[^<>]*` stops at the next `<`: no match attempt reads past it, so the scan is linear.
        self._tag = re.compile(rf"<(/?)({alternatives})(?:\s[^<>]*)?>", re.I) if names else None

    def split(self, text: str) -> tuple[list[str], str]:
        """The blocks' inner texts, and the text outside every block."""
        if self._tag is None or "<" not in text:
            return [], text
        blocks: list[str] = []
        outside: list[str] = []
        open_name: str | None = None
        depth = 0
        start = cursor = 0
        for tag in self._tag.finditer(text):
            closing, name = tag.group(1) == "/", tag.group(2).lower()
            if open_name is None:
                if not closing:
                    outside.append(text[cursor:tag.start()])
                    open_name, depth, start = name, 1, tag.end()
                continue
            if name != open_name:
                continue
            depth += -1 if closing else 1
            if depth == 0:
                blocks.append(text[start:tag.start()])
                open_name, cursor = None, tag.end()
        if open_name is not None:  # unclosed: the block runs to the end
            blocks.append(text[start:])
        else:
            outside.append(text[cursor:])
        return blocks, "".join(outside)


class NemoBlocks:
    """NeMo Guardrails' context blocks in a prompt it rendered, and the text around them, in linear time."""

    # The headings NeMo's templates (nemoguardrails/llm/prompts/*.yml) put above `relevant_chunks`.
    _HEADING = re.compile(r"^[ \t]*(?:# )?This is some (?:additional|relevant) context:[ \t]*\r?\n"
                          r"[ \t]*```markdown[ \t]*\r?\n", re.M)
    _CLOSE = re.compile(r"^[ \t]*```[ \t]*$", re.M)

    def split(self, text: str) -> tuple[list[str], str]:
        """The blocks' texts, and the text outside every block."""
        if "```markdown" not in text:
            return [], text
        blocks: list[str] = []
        outside: list[str] = []
        cursor = 0
        while (heading := self._HEADING.search(text, cursor)) is not None:
            outside.append(text[cursor:heading.start()])
            close = self._CLOSE.search(text, heading.end())
            if close is None:  # no closing fence: the block runs to the end, and nothing is left to scan
                blocks.append(text[heading.end():])
                return blocks, "".join(outside)
            blocks.append(text[heading.end():close.start()])
            cursor = close.end()
        outside.append(text[cursor:])
        return blocks, "".join(outside)


class ContextExtractor:
    def __init__(self, settings: ContextSettings) -> None:
        self.sources = settings.sources
        self.tag_roles = frozenset(settings.tag_roles)
        self.scanner = TagScanner(settings.tags)
        self.nemo = NemoBlocks()
        self.patterns = [re.compile(p, re.S) for p in settings.patterns]  # the operator's own regexes

    def extract(self, body: dict[str, Any]) -> Extraction:
        ours = body.get(OUR_FIELD)
        forwarded = {k: v for k, v in body.items() if k != OUR_FIELD}
        options = {k: v for k, v in ours.items() if k != "context"} if isinstance(ours, dict) else {}
        messages = [m for m in body.get("messages", []) if isinstance(m, dict)]
        for source in self.sources:
            passages = getattr(self, f"_{source}")(ours, messages)
            if passages:
                rag = RagInput(question=self._question(messages), passages=passages, turns=self._turns(messages))
                return Extraction(forwarded, rag, source, options)
        return Extraction(forwarded, None, None, options)

    def _explicit(self, ours: Any, messages: list[dict[str, Any]]) -> list[str]:
        context = ours.get("context") if isinstance(ours, dict) else None
        if isinstance(context, str):
            context = [context]
        return [p for p in context if isinstance(p, str) and p.strip()] if isinstance(context, list) else []

    def _tool(self, ours: Any, messages: list[dict[str, Any]]) -> list[str]:
        return [t for m in messages if m.get("role") == "tool" and (t := message_text(m.get("content")).strip())]

    def _tags(self, ours: Any, messages: list[dict[str, Any]]) -> list[str]:
        passages = []
        for message in messages:
            if message.get("role") in self.tag_roles:
                text = message_text(message.get("content"))
                blocks, _ = self.scanner.split(text)
                blocks += self.nemo.split(text)[0]
                for pattern in self.patterns:
                    blocks += [m.group(1 if pattern.groups else 0) or "" for m in pattern.finditer(text)]
                passages += [b.strip() for b in blocks if b.strip()]
        return passages

    @staticmethod
    def _turns(messages: list[dict[str, Any]]) -> list[str]:
        """The conversation for the topic tagger: every message but the app's instructions, whole."""
        return [text for m in messages
                if m.get("role") not in _INSTRUCTIONS and (text := message_text(m.get("content")))]

    def _question(self, messages: list[dict[str, Any]]) -> str:
        for message in reversed(messages):
            if message.get("role") == "user":
                _, text = self.scanner.split(message_text(message.get("content")))
                _, text = self.nemo.split(text)
                for pattern in self.patterns:
                    text = pattern.sub("", text)
                return text.strip()
        return ""
