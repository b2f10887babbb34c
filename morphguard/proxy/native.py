"""The OpenAI Responses API and the Anthropic Messages API in their own shapes.

Requests go upstream as the client sent them (less our `morphguard` field); for the check, each dialect
reads its request as a chat (`chat_view`: instructions or system as a system message, input items or
messages as messages, tool and file-search results as tool messages), so context extraction and policy
are the chat path's own. The answer is the response's text; what policy does to it is written back in
the dialect's shape (`rewrite`): a blocked answer becomes a refusal the official SDK parses.

Streams are read as server-sent events: the text deltas make the answer, the dialect's last event is
held back until the verdict has gone out as an event of its own (`morphguard.verdict`), and that last
event carries the verdict too.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

from morphguard.policy.answers import UNREADABLE
from morphguard.proxy.body import loads
from morphguard.proxy.context import OUR_FIELD
from morphguard.proxy.errors import bad_request, mask_secrets, upstream_malformed

VERDICT_EVENT = "morphguard.verdict"


@dataclass(frozen=True)
class Event:
    name: str | None
    data: str

    def json(self) -> Any:
        try:
            return loads(self.data)
        except ValueError:
            return None

    def encode(self) -> bytes:
        head = f"event: {self.name}\n" if self.name else ""
        return (head + f"data: {self.data}\n\n").encode()


def event_of(name: str, data: dict[str, Any]) -> Event:
    return Event(name, json.dumps(data))


def sse_event(name: str, data: dict[str, Any]) -> bytes:
    return event_of(name, data).encode()


async def read_events(lines: AsyncIterator[str]) -> AsyncIterator[Event]:
    """Server-sent events from the provider's lines (comments and ids dropped); an error event's secrets masked,
    since the provider may echo the key it was sent."""
    name: str | None = None
    data: list[str] = []
    async for line in lines:
        if not line:
            if data:
                yield _masked(Event(name, "\n".join(data)))
            name, data = None, []
        elif line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
    if data:
        yield _masked(Event(name, "\n".join(data)))


def _masked(event: Event) -> Event:
    if event.name in ("error", "response.failed") or '"error"' in event.data[:200]:
        return Event(event.name, mask_secrets(event.data))
    return event


def _text_of(content: Any, kinds: tuple[str, ...]) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content
                         if isinstance(p, dict) and p.get("type") in kinds and isinstance(p.get("text"), str))
    return ""


class Responses:
    """POST /v1/responses (OpenAI)."""

    name = path = "responses"

    @staticmethod
    def chat_view(body: dict[str, Any]) -> dict[str, Any]:
        messages: list[dict[str, Any]] = []
        if "instructions" in body and body["instructions"] is not None:
            if not isinstance(body["instructions"], str):
                raise bad_request("'instructions' must be a string.", "instructions")
            messages.append({"role": "system", "content": body["instructions"]})
        items = body.get("input")
        if isinstance(items, str):
            items = [{"role": "user", "content": items}]
        if not isinstance(items, list):
            raise bad_request("Missing required parameter: 'input' (a string or an array of items).", "input")
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise bad_request(f"input[{i}] must be an object.", f"input[{i}]")
            kind = item.get("type", "message")
            if kind == "message" and isinstance(item.get("role"), str):
                messages.append({"role": item["role"],
                                 "content": _text_of(item.get("content"), ("input_text", "output_text", "text"))})
            elif kind == "function_call_output" and isinstance(item.get("output"), str):
                messages.append({"role": "tool", "content": item["output"]})
            elif kind == "file_search_call" and isinstance(item.get("results"), list):
                messages += [{"role": "tool", "content": r["text"]} for r in item["results"]
                             if isinstance(r, dict) and isinstance(r.get("text"), str)]
        return _view(body, messages)

    @staticmethod
    def answer(response: Any) -> dict[str, Any]:
        """The response's output as a chat message (`policy.answers`): text, refusals, tool calls, and the
        output types the check cannot read."""
        output = response.get("output") if isinstance(response, dict) else None
        if not isinstance(output, list):
            raise upstream_malformed("not a response with an output array")
        text, refusals, calls, unread = [], [], [], []
        for item in output:
            kind = item.get("type") if isinstance(item, dict) else None
            if kind == "message":
                for part in item.get("content") or []:
                    part = part if isinstance(part, dict) else {}
                    if part.get("type") == "output_text" and isinstance(part.get("text"), str):
                        text.append(part["text"])
                    elif part.get("type") == "refusal" and isinstance(part.get("refusal"), str):
                        refusals.append(part["refusal"])
            elif kind == "function_call" and isinstance(item.get("arguments"), str):
                function = {"name": item.get("name"), "arguments": item["arguments"]}
                calls.append({"type": "function", "function": function})
            elif kind == "custom_tool_call" and isinstance(item.get("input"), str):
                calls.append({"type": "custom", "custom": {"name": item.get("name"), "input": item["input"]}})
            elif kind not in _RESPONSES_NOT_ANSWERS:
                unread.append(str(kind))
        return _message("".join(text), refusals, calls, unread)

    @staticmethod
    def rewrite(response: dict[str, Any], text: str, blocked: bool) -> dict[str, Any]:
        """The answer's text replaced (all of it in the first text part), or, blocked, the answer as the
        provider writes its own refusals: a completed response whose one message is a `refusal` part."""
        out = dict(response)
        if blocked:
            # Ids the provider never issued: a later request cannot name the stored blocked response
            # (`previous_response_id`) or its message (`item_reference`) to have it repeated.
            out["id"] = f"resp_blocked_{secrets.token_hex(12)}"
            item = {"type": "message", "id": f"msg_blocked_{secrets.token_hex(12)}",
                    "role": "assistant", "status": "completed",
                    "content": [{"type": "refusal", "refusal": text}]}
            out["output"] = [item]
            out["status"] = "completed"
            out["incomplete_details"] = None
            return out
        first = True
        rebuilt = []
        for item in out.get("output", []):
            if isinstance(item, dict) and item.get("type") == "message":
                parts: list[Any] = []
                for part in item.get("content") or []:
                    if isinstance(part, dict) and part.get("type") == "output_text":
                        if first:
                            parts.append({**part, "text": text, "annotations": []})
                            first = False
                        continue
                    parts.append(part)
                item = {**item, "content": parts}
            rebuilt.append(item)
        out["output"] = rebuilt
        return out

    @staticmethod
    def delta(event: Event) -> str:
        if event.name == "response.output_text.delta":
            data = event.json()
            if isinstance(data, dict) and isinstance(data.get("delta"), str):
                return data["delta"]
        return ""

    @staticmethod
    def is_last(event: Event) -> bool:
        return event.name in ("response.completed", "response.incomplete", "response.failed")

    @staticmethod
    def collected(events: list[Event]) -> dict[str, Any] | None:
        """The whole response, as the stream's last event carries it."""
        data = events[-1].json() if events else None
        return data.get("response") if isinstance(data, dict) and isinstance(data.get("response"), dict) else None

    @staticmethod
    def with_verdict(event: Event, verdict: dict[str, Any]) -> Event:
        data = event.json()
        if isinstance(data, dict) and isinstance(data.get("response"), dict):
            data["response"][OUR_FIELD] = verdict
            return Event(event.name, json.dumps(data))
        return event

    @staticmethod
    def synthesize(response: dict[str, Any]) -> Iterator[Event]:
        """A stream that says what `response` says: the events the SDK assembles into it."""
        seq = 0

        def event(name: str, **data: Any) -> Event:
            nonlocal seq
            seq += 1
            return event_of(name, {"type": name, "sequence_number": seq, **data})

        final = "response.incomplete" if response.get("status") == "incomplete" else "response.completed"
        yield event("response.created", response={**response, "status": "in_progress", "output": []})
        for index, item in enumerate(response.get("output", [])):
            yield event("response.output_item.added", output_index=index, item={**item, "content": []})
            for part_index, part in enumerate(item.get("content") or []):
                at = {"output_index": index, "item_id": item.get("id"), "content_index": part_index}
                # a part opens empty and its words follow as deltas, which clients add up
                if part.get("type") == "output_text":
                    yield event("response.content_part.added", **at, part={**part, "text": ""})
                    yield event("response.output_text.delta", **at, delta=part["text"], logprobs=[])
                    yield event("response.output_text.done", **at, text=part["text"], logprobs=[])
                elif part.get("type") == "refusal":
                    yield event("response.content_part.added", **at, part={**part, "refusal": ""})
                    yield event("response.refusal.delta", **at, delta=part["refusal"])
                    yield event("response.refusal.done", **at, refusal=part["refusal"])
                else:
                    yield event("response.content_part.added", **at, part=part)
                yield event("response.content_part.done", **at, part=part)
            yield event("response.output_item.done", output_index=index, item=item)
        yield event(final, response=response)


class Messages:
    """POST /v1/messages (Anthropic)."""

    name = path = "messages"

    @staticmethod
    def chat_view(body: dict[str, Any]) -> dict[str, Any]:
        messages: list[dict[str, Any]] = []
        system = body.get("system")
        if system is not None:
            if not isinstance(system, str | list):
                raise bad_request("'system' must be a string or an array of text blocks.", "system")
            messages.append({"role": "system", "content": _text_of(system, ("text",))})
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
                        text = _text_of(block.get("content"), ("text",))
                        if text.strip():
                            messages.append({"role": "tool", "content": text})
                content = _text_of(content, ("text",))
            messages.append({"role": turn["role"], "content": content if isinstance(content, str) else ""})
        return _view(body, messages)

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
            elif kind not in _MESSAGES_NOT_ANSWERS:
                unread.append(str(kind))
        return _message("".join(text), [], calls, unread)

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
    def delta(event: Event) -> str:
        if event.name == "content_block_delta":
            data = event.json()
            delta = data.get("delta") if isinstance(data, dict) else None
            if isinstance(delta, dict) and delta.get("type") == "text_delta" and isinstance(delta.get("text"), str):
                return delta["text"]
        return ""

    @staticmethod
    def is_last(event: Event) -> bool:
        return event.name == "message_stop"

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
                    block["text"] = block.get("text", "") + Messages.delta(event)
            elif event.name == "message_delta" and message is not None and isinstance(data.get("delta"), dict):
                message.update({k: v for k, v in data["delta"].items() if k in ("stop_reason", "stop_sequence")})
                if isinstance(data.get("usage"), dict):
                    message["usage"] = {**(message.get("usage") or {}), **data["usage"]}
        if message is not None:
            message["content"] = [blocks[i] for i in sorted(blocks)]
        return message

    @staticmethod
    def with_verdict(event: Event, verdict: dict[str, Any]) -> Event:
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


Dialect = type[Responses] | type[Messages]

# Output that is not the model's answer to the user (its reasoning, the provider's own tool runs): not read.
_RESPONSES_NOT_ANSWERS = frozenset({"reasoning", "file_search_call", "web_search_call"})
_MESSAGES_NOT_ANSWERS = frozenset({"thinking", "redacted_thinking", "server_tool_use", "web_search_tool_result"})


def _message(text: str, refusals: list[str], calls: list[dict[str, Any]], unread: list[str]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if refusals:
        message["refusal"] = "\n".join(refusals)
    if calls:
        message["tool_calls"] = calls
    if unread:
        message[UNREADABLE] = unread
    return message


def _document_text(source: Any) -> str:
    """A document block's text: plain text data, or text blocks of a content source (PDFs are not read)."""
    if not isinstance(source, dict):
        return ""
    if source.get("type") == "text" and isinstance(source.get("data"), str):
        return str(source["data"])
    return _text_of(source.get("content"), ("text",)) if source.get("type") == "content" else ""


def _view(body: dict[str, Any], messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat-shaped request the context extractor and policy read."""
    view: dict[str, Any] = {"messages": messages}
    for key in ("model", "stream", OUR_FIELD):
        if key in body:
            view[key] = body[key]
    return view


def as_completion(message: dict[str, Any]) -> dict[str, Any]:
    """The answer as the guard reads and rewrites it (chat completion shape)."""
    return {"object": "chat.completion", "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}
