"""POST /v1/chat/completions: the API the guard reads natively (its completion is what policy checks and
rewrites). Streams are chunk objects, one per unnamed event, ended by `[DONE]`; the verdict goes out as one
extra chunk with no choices (clients skip it like a usage chunk) just before `[DONE]`."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from morphguard.policy.answers import UNREADABLE, content_refusal, content_text, message_of, said, unread_parts
from morphguard.proxy.body import chat_completion, int_or_none, loads, parse_chat, readable_content, str_or_none
from morphguard.proxy.context import OUR_FIELD
from morphguard.proxy.dialects.base import Event, Usage
from morphguard.proxy.errors import ProxyError, bad_request, json_bytes, upstream_malformed, upstream_stream_broken

DONE = Event(None, "[DONE]")


class ChatCompletions:
    name = "chat/completions"
    provider: str | None = None
    can_reask = True
    via_litellm = True

    @staticmethod
    def read(raw: bytes) -> dict[str, Any]:
        body = parse_chat(raw)
        n = body.get("n")
        if n is not None and (type(n) is not int or n != 1):
            raise bad_request("'n' must be 1: the guard checks one answer per request.", "n")
        return body

    @staticmethod
    def chat_view(body: dict[str, Any]) -> dict[str, Any]:
        return body

    @staticmethod
    def completion(response: Any) -> dict[str, Any]:
        return chat_completion(response)

    @staticmethod
    def usage(response: dict[str, Any]) -> Usage:
        usage: dict[str, Any] = response["usage"] if isinstance(response.get("usage"), dict) else {}
        choices: list[Any] = response["choices"] if isinstance(response.get("choices"), list) else []
        return Usage(str_or_none(response.get("model")), int_or_none(usage.get("prompt_tokens")),
                     int_or_none(usage.get("completion_tokens")),
                     tuple(str(c.get("finish_reason")) for c in choices if isinstance(c, dict)))

    @staticmethod
    def written(response: dict[str, Any], checked: dict[str, Any], blocked: bool) -> dict[str, Any]:
        return checked

    @staticmethod
    def assembly() -> ChatAssembly:
        return ChatAssembly()

    @staticmethod
    def replay(response: dict[str, Any]) -> list[Event]:
        answer = StreamedAnswer.of(response)
        message = message_of(response)
        finish = (response.get("choices") or [{}])[0].get("finish_reason") or "stop"
        return [*(_chunk(c) for c in answer.replacement_chunks(message, finish)), DONE]

    @staticmethod
    def refused_ending(sent: Sequence[Event], text: str) -> list[Event]:
        """The refusal as the provider streams one: `text` as the `refusal` delta and as `content` (after what
        content went out already), then `stop`."""
        answer = StreamedAnswer()
        for event in sent:
            answer.add(event.json())
        content = f"\n\n{text}" if answer.text.strip() else text
        return [_chunk(answer.chunk([{"index": 0, "delta": {"content": content, "refusal": text},
                                      "finish_reason": None}])),
                _chunk(answer.chunk([{"index": 0, "delta": {}, "finish_reason": "stop"}])), DONE]

    @staticmethod
    def with_verdict(last: Event | None, verdict: dict[str, Any],
                     response: dict[str, Any] | None) -> list[Event]:
        return [_chunk(StreamedAnswer.of(response or {}).chunk([]) | {OUR_FIELD: verdict}), DONE]

    @staticmethod
    def stream_error(error: ProxyError) -> Event:
        return _chunk(error.payload())  # an unnamed error event: the official SDKs raise it as an APIError


class ChatAssembly:
    """Chunks of the one choice asked for, checked as they pass: a chunk that is not one (another choice beside it,
    or it twice, included), or an error chunk, breaks the stream; so does its end before a finish reason."""

    def __init__(self) -> None:
        self.answer = StreamedAnswer()

    @property
    def text(self) -> str:
        return "".join(self.answer.words)

    @property
    def added(self) -> str:
        return self.answer.added

    @property
    def opaque(self) -> bool:
        return self.answer.opaque

    def add(self, event: Event) -> bool:
        self.answer.added = ""
        if event.data.strip() == "[DONE]":
            return True
        try:
            chunk = loads(event.data)
        except (ValueError, RecursionError):
            raise upstream_malformed("a stream chunk is not valid JSON") from None
        if isinstance(chunk, dict) and chunk.get("error") is not None:
            raise upstream_stream_broken("the provider reported an error mid-stream")
        if not self.answer.add(chunk):
            raise upstream_malformed("a stream chunk is not a chat completion chunk of the one answer asked for")
        return False


    def finish(self) -> None:
        if self.answer.finish_reason is None:
            raise upstream_stream_broken("the stream ended before the answer was finished")

    def response(self) -> dict[str, Any]:
        return self.answer.as_completion()

    def completion(self) -> dict[str, Any]:
        return self.answer.as_completion()


@dataclass
class StreamedAnswer:
    """The answer as it is assembled from the chunks of its one choice: every field a whole answer's message
    has that `policy.answers` reads (content as text or text parts, refusal, audio transcript, tool calls and the
    legacy function call), each a delta at a time; `words` are the words in the order they came, tool calls aside
    (what a stream checked as it flows reads)."""

    id: str = ""
    model: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    parts: list[str] = field(default_factory=list)
    refusal: list[str] = field(default_factory=list)
    audio: dict[str, Any] | None = None  # the audio's id (its data is not kept)
    transcript: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)  # by the call's index in the deltas
    function_call: dict[str, str] | None = None  # the legacy single call (`functions` offered)
    unread: list[str] = field(default_factory=list)  # the content parts the check cannot read, by type
    finish_reason: str | None = None
    words: list[str] = field(default_factory=list)
    added: str = ""  # the words of the last chunk taken
    opaque: bool = False  # the last chunk taken carries more than words: a tool call, audio data, a part not text

    @classmethod
    def of(cls, completion: dict[str, Any]) -> StreamedAnswer:
        """The chunk header (id, model, time) of a whole completion."""
        answer = cls(id=str_or_none(completion.get("id")) or "", model=str_or_none(completion.get("model")) or "")
        if isinstance(completion.get("created"), int):
            answer.created = completion["created"]
        return answer

    def add(self, chunk: Any) -> bool:
        """Take in one chunk; False (nothing taken) when it is not shaped like a chat completion chunk."""
        choices = chunk.get("choices", []) if isinstance(chunk, dict) else None
        if not isinstance(choices, list) or not all(
                isinstance(c, dict) and isinstance(c.get("delta") or {}, dict)
                and readable_content((c.get("delta") or {}).get("content")) for c in choices) \
                or not _one_choice(choices):
            return False
        self.id = str_or_none(chunk.get("id")) or self.id
        self.model = str_or_none(chunk.get("model")) or self.model
        created = chunk.get("created")
        self.created = created if isinstance(created, int) else self.created
        self.added = ""
        self.opaque = False
        for choice in choices:
            delta = choice.get("delta") or {}
            self.parts.append(content_text(delta.get("content")))
            self.unread += unread_parts(delta.get("content"))
            refusal = delta.get("refusal")
            self.refusal += [r for r in (content_refusal(delta.get("content")), refusal)
                             if isinstance(r, str) and r]
            self._add_audio(delta.get("audio"))
            self._add_calls(delta.get("tool_calls"))
            self._add_function_call(delta.get("function_call"))
            self.added = said(delta)
            self.opaque = _opaque(delta)
            self.words.append(self.added)
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
        return True

    def _add_audio(self, audio: Any) -> None:
        """A spoken answer arrives as pieces of its transcript (and of its data, which the check cannot read)."""
        if not isinstance(audio, dict):
            return
        self.audio = self.audio or {}
        if isinstance(audio.get("id"), str):
            self.audio["id"] = audio["id"]
        if isinstance(audio.get("transcript"), str):
            self.transcript.append(audio["transcript"])

    def _add_function_call(self, call: Any) -> None:
        if isinstance(call, dict):
            whole = self.function_call = self.function_call or {"name": "", "arguments": ""}
            for key in ("name", "arguments"):
                if isinstance(call.get(key), str):
                    whole[key] += call[key]

    def _add_calls(self, calls: Any) -> None:
        """Tool calls arrive in pieces: an id, type and name first, then the arguments (a custom tool's input) a
        fragment at a time."""
        for call in calls if isinstance(calls, list) else []:
            if not isinstance(call, dict) or not isinstance(call.get("index", 0), int):
                continue
            whole = self.tool_calls.setdefault(call.get("index", 0), {"type": "function"})
            for key in ("id", "type"):
                if isinstance(call.get(key), str):
                    whole[key] = call[key]
            for kind, words in (("function", "arguments"), ("custom", "input")):
                given = call.get(kind)
                if isinstance(given, dict):
                    piece = whole.setdefault(kind, {"name": "", words: ""})
                    for key in ("name", words):
                        if isinstance(given.get(key), str):
                            piece[key] += given[key]

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def chunk(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": choices}

    def as_completion(self) -> dict[str, Any]:
        """The assembled answer as a non-streamed completion."""
        message: dict[str, Any] = {"role": "assistant", "content": self.text}
        if self.refusal:
            message["refusal"] = "".join(self.refusal)
        if self.audio is not None:
            message["audio"] = {**self.audio, "transcript": "".join(self.transcript)}
        if self.tool_calls:
            message["tool_calls"] = [self._call(self.tool_calls[i]) for i in sorted(self.tool_calls)]
        if self.function_call is not None:
            message["function_call"] = dict(self.function_call)
        if self.unread:
            message[UNREADABLE] = list(dict.fromkeys(self.unread))
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "message": message, "finish_reason": self.finish_reason or "stop"}]}

    @staticmethod
    def _call(call: dict[str, Any]) -> dict[str, Any]:
        """A whole tool call: a function's (its name and arguments empty where none came) or a custom tool's."""
        if "custom" in call or "function" in call:
            return dict(call)
        return {**call, "function": {"name": "", "arguments": ""}}

    def replacement_chunks(self, message: dict[str, Any], finish_reason: str) -> list[dict[str, Any]]:
        """The chunks of a rewritten answer: its text and refusal (a blocked answer's), then its tool calls (none
        once blocked), then the end."""
        delta: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
        if isinstance(message.get("refusal"), str):
            delta["refusal"] = message["refusal"]
        if isinstance(message.get("audio"), dict):
            delta["audio"] = message["audio"]
        calls = message.get("tool_calls")
        if isinstance(calls, list) and calls:
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(calls)]
        if isinstance(message.get("function_call"), dict):
            delta["function_call"] = message["function_call"]
        return [self.chunk([{"index": 0, "delta": delta, "finish_reason": None}]),
                self.chunk([{"index": 0, "delta": {}, "finish_reason": finish_reason}])]


def _opaque(delta: dict[str, Any]) -> bool:
    """Whether a delta carries part of the answer other than words: a tool call (its name or arguments), audio data,
    a content part that is not text or a refusal."""
    audio, content = delta.get("audio"), delta.get("content")
    return bool(delta.get("tool_calls") or delta.get("function_call")
                or isinstance(audio, dict) and audio.get("data") or unread_parts(content))


def _one_choice(choices: list[dict[str, Any]]) -> bool:
    """Whether a chunk's choices are at most one, the first (the request asked for one answer, `n` 1): a second
    choice, or the first twice, would carry words past the one reading of the stream."""
    return len(choices) <= 1 and all(c.get("index", 0) == 0 for c in choices)


def _chunk(chunk: dict[str, Any]) -> Event:
    return Event(None, json_bytes(chunk).decode())

