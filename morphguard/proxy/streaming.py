"""Server-sent events of chat completion chunks: read them, add up the answer, write our own."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

DONE = b"data: [DONE]\n\n"


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


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
    finish_reason: str | None = None

    def add(self, chunk: dict[str, Any]) -> None:
        self.id = chunk.get("id") or self.id
        self.model = chunk.get("model") or self.model
        self.created = chunk.get("created") or self.created
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) == 0:
                content = (choice.get("delta") or {}).get("content")
                if isinstance(content, str):
                    self.parts.append(content)
                if choice.get("finish_reason"):
                    self.finish_reason = str(choice["finish_reason"])

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def chunk(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": choices, **extra}

    def as_completion(self) -> dict[str, Any]:
        """The assembled answer as a non-streamed completion, for review."""
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": self.text},
                             "finish_reason": "stop"}]}

    def verdict_chunk(self, verdict: dict[str, Any]) -> dict[str, Any]:
        """One extra chunk with no choices (clients skip it like a usage chunk) carrying the verdict."""
        return self.chunk([], morphguard=verdict)

    def replacement_chunks(self, content: str, finish_reason: str) -> list[dict[str, Any]]:
        return [self.chunk([{"index": 0, "delta": {"role": "assistant", "content": content}, "finish_reason": None}]),
                self.chunk([{"index": 0, "delta": {}, "finish_reason": finish_reason}])]
