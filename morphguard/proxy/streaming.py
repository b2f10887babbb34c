"""Server-sent events of chat completion chunks: read them, add up the answer, write our own."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from morphguard.proxy.body import loads
from morphguard.proxy.errors import json_bytes, upstream_malformed, upstream_stream_broken

DONE = b"data: [DONE]\n\n"


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json_bytes(payload) + b"\n\n"


async def events(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    """The `data:` payloads of an SSE stream, one per event (multi-line data joined)."""
    data: list[str] = []
    async for line in lines:
        if line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
        elif not line.strip() and data:
            yield "\n".join(data)
            data = []
    if data:
        yield "\n".join(data)


@dataclass
class StreamedAnswer:
    """The answer as it is assembled from the chunks of the first choice."""

    id: str = ""
    model: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    parts: list[str] = field(default_factory=list)
    refusal: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)  # by the call's index in the deltas
    finish_reason: str | None = None

    def add(self, chunk: Any) -> bool:
        """Take in one chunk; False (nothing taken) when it is not shaped like a chat completion chunk."""
        choices = chunk.get("choices", []) if isinstance(chunk, dict) else None
        if not isinstance(choices, list) or not all(
                isinstance(c, dict) and isinstance(c.get("delta") or {}, dict) for c in choices):
            return False
        self.id = _string(chunk.get("id")) or self.id
        self.model = _string(chunk.get("model")) or self.model
        created = chunk.get("created")
        self.created = created if isinstance(created, int) else self.created
        for choice in choices:
            if choice.get("index", 0) == 0:
                delta = choice.get("delta") or {}
                if isinstance(delta.get("content"), str):
                    self.parts.append(delta["content"])
                if isinstance(delta.get("refusal"), str):
                    self.refusal.append(delta["refusal"])
                self._add_calls(delta.get("tool_calls"))
                if choice.get("finish_reason"):
                    self.finish_reason = str(choice["finish_reason"])
        return True

    def _add_calls(self, calls: Any) -> None:
        """Tool calls arrive in pieces: an id, type and name first, then the arguments a fragment at a time."""
        for call in calls if isinstance(calls, list) else []:
            if not isinstance(call, dict) or not isinstance(call.get("index", 0), int):
                continue
            whole = self.tool_calls.setdefault(call.get("index", 0), {"type": "function",
                                                                       "function": {"name": "", "arguments": ""}})
            for key in ("id", "type"):
                if isinstance(call.get(key), str):
                    whole[key] = call[key]
            function = call.get("function")
            if isinstance(function, dict):
                for key in ("name", "arguments"):
                    if isinstance(function.get(key), str):
                        whole["function"][key] += function[key]

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def chunk(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": choices, **extra}

    def as_completion(self) -> dict[str, Any]:
        """The assembled answer as a non-streamed completion, for review."""
        message: dict[str, Any] = {"role": "assistant", "content": self.text}
        if self.refusal:
            message["refusal"] = "".join(self.refusal)
        if self.tool_calls:
            message["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "message": message, "finish_reason": self.finish_reason or "stop"}]}

    def decision_chunk(self, payload: dict[str, Any]) -> dict[str, Any]:
        """One extra chunk with no choices (clients skip it like a usage chunk) carrying our `morphguard` object."""
        return self.chunk([], morphguard=payload)

    def replacement_chunks(self, message: dict[str, Any], finish_reason: str) -> list[dict[str, Any]]:
        """The chunks of a rewritten answer: its text and refusal (a blocked answer's), then its tool calls (none
        once blocked), then the end."""
        delta: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
        if isinstance(message.get("refusal"), str):
            delta["refusal"] = message["refusal"]
        calls = message.get("tool_calls")
        if isinstance(calls, list) and calls:
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(calls)]
        return [self.chunk([{"index": 0, "delta": delta, "finish_reason": None}]),
                self.chunk([{"index": 0, "delta": {}, "finish_reason": finish_reason}])]


def _string(value: Any) -> str | None:
    return value if isinstance(value, str) else None


async def chunk_payloads(source: AsyncIterator[str], answer: StreamedAnswer) -> AsyncIterator[str]:
    """The chunk payloads up to [DONE], each also added to `answer`. A stream that breaks, stalls, carries
    something other than chunk objects or ends before its finish reason raises ProxyError."""
    async for payload in source:  # a break or a stall in `source` is already a ProxyError
        if payload.strip() == "[DONE]":
            break
        try:
            chunk = loads(payload)
        except (ValueError, RecursionError):
            raise upstream_malformed("a stream chunk is not valid JSON") from None
        if isinstance(chunk, dict) and chunk.get("error") is not None:
            raise upstream_stream_broken("the provider reported an error mid-stream")
        if not answer.add(chunk):
            raise upstream_malformed("a stream chunk is not a chat completion chunk")
        yield payload
    if answer.finish_reason is None:
        raise upstream_stream_broken("the stream ended before the answer was finished")
