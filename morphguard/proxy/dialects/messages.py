"""POST /v1/messages (Anthropic's Messages API) in its own shape, sent to `proxy.anthropic` when set.

For the check, `system` becomes a system message, text blocks messages, documents and tool results tool
messages. The answer is read from its text and tool-use blocks; a stream's text from its text deltas and from the
text a block may already hold when it starts. A blocked answer is the safe message alone, stopped for `refusal` as
Anthropic writes its own refusals. A stream's `message_stop` is held back until the verdict event has gone out,
and carries the verdict too.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from morphguard.proxy.body import int_or_none
from morphguard.proxy.context import OUR_FIELD
from morphguard.proxy.dialects.base import (
    Event,
    EventDialect,
    chat_message,
    chat_request,
    event_of,
    text_of,
)
from morphguard.proxy.errors import ProxyError, bad_request, upstream_malformed

# Output that is not the model's answer to the user (its reasoning, the provider's own tool runs): not read.
_NOT_ANSWERS = frozenset({"thinking", "redacted_thinking", "server_tool_use", "web_search_tool_result"})


class Messages(EventDialect):
    """POST /v1/messages (Anthropic)."""

    name = "messages"
    provider: str | None = "anthropic"
    can_reask = False
    via_litellm = False
    EMPTY: dict[str, Any] = {"type": "message", "role": "assistant", "content": []}

    @classmethod
    def refused_ending(cls, sent: Sequence[Event], text: str) -> list[Event]:
        """The refusal as Anthropic streams one: `text` as text (after what text went out already, in the
        open text block, else in a new one), then `stop_reason: refusal` with `text` as its explanation."""
        blocks, open_block, tokens = 0, None, 0
        said = any(cls.added(event, {}) for event in sent)
        for event in sent:
            data = event.json()
            if not isinstance(data, dict):
                continue
            if event.name == "content_block_start":
                blocks += 1
                block = data.get("content_block")
                open_block = data.get("index", blocks - 1) if isinstance(block, dict) and block.get(
                    "type") == "text" else None
            elif event.name == "content_block_stop":
                open_block = None
            elif event.name == "message_start" and isinstance(data.get("message"), dict):
                usage = data["message"].get("usage")
                tokens = int_or_none(usage.get("output_tokens")) or 0 if isinstance(usage, dict) else 0
        out = []
        index = open_block
        if index is None:
            index = blocks
            out.append(event_of("content_block_start", {"type": "content_block_start", "index": index,
                                                         "content_block": {"type": "text", "text": ""}}))
        delta = {"type": "text_delta", "text": f"\n\n{text}" if said else text}
        details = {"type": "refusal", "category": None, "explanation": text}
        return out + [
            event_of("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}),
            event_of("content_block_stop", {"type": "content_block_stop", "index": index}),
            event_of("message_delta", {"type": "message_delta",
                                        "delta": {"stop_reason": "refusal", "stop_sequence": None,
                                                  "stop_details": details},
                                        "usage": {"output_tokens": tokens}}),
            event_of("message_stop", {"type": "message_stop"})]

    @staticmethod
    def chat_view(body: dict[str, Any]) -> dict[str, Any]:
        messages: list[dict[str, Any]] = []
        system = body.get("system")
        if system is not None:
            if not isinstance(system, str | list):
                raise bad_request("'system' must be a string or an array of text blocks.", "system")
            messages.append({"role": "system", "content": text_of(system, ("text",))})
        turns = body.get("messages")
        if not isinstance(turns, list) or not turns:
            raise bad_request("Missing required parameter: 'messages' (a non-empty array).", "messages")
        for i, turn in enumerate(turns):
            if not isinstance(turn, dict) or not isinstance(turn.get("role"), str):
                raise bad_request(f"messages[{i}] must be an object with a string 'role'.", f"messages[{i}]")
            content = turn.get("content")
            if isinstance(content, list):
                for block in content:
                    if not isinstance(block, dict):
                        continue
                    if block.get("type") == "document":
                        text = _document_text(block.get("source"))
                        if text.strip():
                            messages.append({"role": "tool", "content": text})
                    elif block.get("type") == "tool_result":
                        text = text_of(block.get("content"), ("text",))
                        if text.strip():
                            messages.append({"role": "tool", "content": text})
                content = text_of(content, ("text",))
            messages.append({"role": turn["role"], "content": content if isinstance(content, str) else ""})
        return chat_request(body, messages)

    @staticmethod
    def answer(response: Any) -> dict[str, Any]:
        """The message's content as a chat message (`policy.answers`): text, tool uses, and the block types
        the check cannot read."""
        content = response.get("content") if isinstance(response, dict) else None
        if not isinstance(content, list):
            raise upstream_malformed("not a message with a content array")
        text, calls, unread = [], [], []
        for block in content:
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text" and isinstance(block.get("text"), str):
                text.append(block["text"])
            elif kind == "tool_use":
                given = block.get("input")
                arguments = given if isinstance(given, str) else json.dumps(given, ensure_ascii=False)
                calls.append({"type": "function", "function": {"name": block.get("name"), "arguments": arguments}})
            elif kind not in _NOT_ANSWERS:
                unread.append(str(kind))
        return chat_message("".join(text), [], calls, unread)

    @staticmethod
    def rewrite(response: dict[str, Any], text: str, blocked: bool) -> dict[str, Any]:
        """The answer's text replaced, or, blocked, a refusal as Anthropic writes one: `stop_reason`
        `refusal`, the safe message as its text and as the refusal's explanation (`stop_details`)."""
        out = dict(response)
        others = [b for b in out.get("content", []) if isinstance(b, dict) and b.get("type") != "text"]
        out["content"] = [{"type": "text", "text": text}] + ([] if blocked else others)
        if blocked:
            out["stop_reason"] = "refusal"
            out["stop_sequence"] = None
            out["stop_details"] = {"type": "refusal", "category": None, "explanation": text}
        return out

    @staticmethod
    def added(event: Event, said: dict[Any, list[str]]) -> str:
        """The text this event adds: a text delta's, or the text a text block holds as it starts. No event repeats
        a block's text, so none is weighed against what was `said`."""
        if event.name not in ("content_block_start", "content_block_delta"):
            return ""
        data = event.json()
        if not isinstance(data, dict):
            return ""
        return _text_delta(data) if event.name == "content_block_delta" else _block_text(data.get("content_block"))

    @staticmethod
    def is_last(event: Event) -> bool:
        return event.name == "message_stop"

    @staticmethod
    def opaque(event: Event) -> bool:
        """Whether the event carries content other than text: a tool use (its start or its input), a block of a
        kind not known here; framing (`message_start`, `ping`, `message_delta`, a block's stop), text and output
        that is not the answer (thinking, the provider's own tool runs) do not."""
        if event.name in ("message_start", "ping", "message_delta", "content_block_stop"):
            return False
        data = event.json()
        if not isinstance(data, dict):
            return True
        if event.name == "content_block_start":
            block = data.get("content_block")
            kind = block.get("type") if isinstance(block, dict) else None
            return kind != "text" and kind not in _NOT_ANSWERS
        if event.name == "content_block_delta":
            delta = data.get("delta")
            kind = delta.get("type") if isinstance(delta, dict) else None
            return kind not in ("text_delta", "citations_delta", "thinking_delta", "signature_delta")
        return True

    @staticmethod
    def collected(events: list[Event]) -> dict[str, Any] | None:
        """The message the events build: message_start's, with the text blocks and the final stop reason."""
        message: dict[str, Any] | None = None
        blocks: dict[int, dict[str, Any]] = {}
        for event in events:
            data = event.json()
            if not isinstance(data, dict):
                continue
            if event.name == "message_start" and isinstance(data.get("message"), dict):
                message = dict(data["message"])
            elif event.name == "content_block_start" and isinstance(data.get("content_block"), dict):
                blocks[int(data.get("index", len(blocks)))] = dict(data["content_block"])
            elif event.name == "content_block_delta":
                block = blocks.setdefault(int(data.get("index", 0)), {"type": "text", "text": ""})
                delta: dict[str, Any] = data["delta"] if isinstance(data.get("delta"), dict) else {}
                if block.get("type") == "tool_use" and isinstance(delta.get("partial_json"), str):
                    # the input arrives as JSON text in pieces; the check reads it as text
                    so_far = block.get("input")
                    block["input"] = (so_far if isinstance(so_far, str) else "") + delta["partial_json"]
                elif block.get("type") == "text":
                    block["text"] = block.get("text", "") + _text_delta(data)
            elif event.name == "message_delta" and message is not None and isinstance(data.get("delta"), dict):
                message.update({k: v for k, v in data["delta"].items() if k in ("stop_reason", "stop_sequence")})
                if isinstance(data.get("usage"), dict):
                    message["usage"] = {**(message.get("usage") or {}), **data["usage"]}
        if message is not None:
            message["content"] = [blocks[i] for i in sorted(blocks)]
        return message

    @classmethod
    def disagrees(cls, events: list[Event], said: dict[Any, list[str]], text: str) -> str | None:
        """The message's text against the text its events carried: a text delta on a block that is not text went
        to the client, and is in no block of the message."""
        message = cls.collected(events)
        try:
            answer = cls.answer(message)
        except ProxyError:  # no message: the check reads the text the events carried
            return None
        return None if answer["content"] == text else "text deltas on blocks that are not text"

    @staticmethod
    def attach(event: Event, verdict: dict[str, Any]) -> Event:
        """The event with the verdict in the response it carries."""
        data = event.json()
        if isinstance(data, dict):
            data[OUR_FIELD] = verdict
            return Event(event.name, json.dumps(data))
        return event

    @staticmethod
    def synthesize(message: dict[str, Any]) -> Iterator[Event]:
        yield event_of("message_start", {"type": "message_start",
                                          "message": {**message, "content": [], "stop_reason": None,
                                                      "stop_details": None}})
        for index, block in enumerate(message.get("content", [])):
            if block.get("type") != "text":
                continue
            yield event_of("content_block_start", {"type": "content_block_start", "index": index,
                                                    "content_block": {"type": "text", "text": ""}})
            yield event_of("content_block_delta", {"type": "content_block_delta", "index": index,
                                                    "delta": {"type": "text_delta", "text": block["text"]}})
            yield event_of("content_block_stop", {"type": "content_block_stop", "index": index})
        ending = {"stop_reason": message.get("stop_reason"), "stop_sequence": None}
        if message.get("stop_details") is not None:
            ending["stop_details"] = message["stop_details"]
        yield event_of("message_delta", {"type": "message_delta", "delta": ending,
                                          "usage": {"output_tokens": (message.get("usage") or {}).get("output_tokens",
                                                                                                       0)}})
        yield event_of("message_stop", {"type": "message_stop"})


def _text_delta(data: dict[str, Any]) -> str:
    delta = data.get("delta")
    if isinstance(delta, dict) and delta.get("type") == "text_delta" and isinstance(delta.get("text"), str):
        return str(delta["text"])
    return ""


def _block_text(block: Any) -> str:
    if isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str):
        return str(block["text"])
    return ""


def _document_text(source: Any) -> str:
    """A document block's text: plain text data, or text blocks of a content source (PDFs are not read)."""
    if not isinstance(source, dict):
        return ""
    if source.get("type") == "text" and isinstance(source.get("data"), str):
        return str(source["data"])
    return text_of(source.get("content"), ("text",)) if source.get("type") == "content" else ""

