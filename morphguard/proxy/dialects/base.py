"""What the request path needs to know of an API (`Dialect`), and the server-sent events all of them stream.

A dialect reads its request as a chat (`chat_view`), so that context extraction and policy are the same for
every API, and its answer as a chat completion (`completion`, in the shape `policy.answers` reads), so that the
check and the actions are too. What policy did to that completion is written back in the dialect's own shape
(`written`). A stream is read event by event (`Assembly`), by the same reading of the same fields: the words each
event adds (`Assembly.added`) are what its answer's `completion` holds, whether they came in deltas or whole in an
event that opens or closes a part. A dialect says how its stream ends as a refused answer (`refused_ending`) and
how an event carries a verdict (`with_verdict`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from morphguard.masking import mask_secrets
from morphguard.policy.answers import UNREADABLE, as_completion, message_of, prose
from morphguard.proxy.body import int_or_none, loads, parse_object
from morphguard.proxy.context import OUR_FIELD
from morphguard.proxy.errors import ProxyError, upstream_malformed, upstream_stream_broken


class Event(NamedTuple):
    """One server-sent event: its name (None for unnamed events, as chat completion chunks are) and its data.
    A tuple: a stream makes one per chunk, and that is the cheapest object to make."""

    name: str | None
    data: str

    def json(self) -> Any:
        try:
            return loads(self.data)
        except (ValueError, RecursionError):
            return None

    def encode(self) -> bytes:
        if self.name:
            return f"event: {self.name}\ndata: {self.data}\n\n".encode()
        return b"data: " + self.data.encode() + b"\n\n"


def event_of(name: str | None, data: dict[str, Any]) -> Event:
    return Event(name, json.dumps(data))


async def read_events(lines: AsyncIterator[str]) -> AsyncIterator[Event]:
    """Server-sent events from the provider's lines (comments and ids dropped); an error event's secrets masked,
    since the provider may echo the key it was sent."""
    name: str | None = None
    data: list[str] = []
    async for line in lines:
        if not line.strip():
            if data:
                yield _masked(Event(name, "\n".join(data)))
            name, data = None, []
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
        elif line.startswith("event:"):
            name = line[6:].strip()
    if data:
        yield _masked(Event(name, "\n".join(data)))


def _masked(event: Event) -> Event:
    if event.name in ("error", "response.failed") or '"error"' in event.data[:200]:
        return Event(event.name, mask_secrets(event.data))
    return event


@dataclass(frozen=True)
class Usage:
    """What the GenAI span records of an answer."""

    model: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    finish_reasons: tuple[str, ...] = ()


class Assembly(Protocol):
    """One stream's answer, put together event by event as the events pass."""

    @property
    def text(self) -> str:
        """The answer's words so far (what a broken stream's audit row keeps): what the events taken `added`."""

    @property
    def added(self) -> str:
        """The words of the answer the event last taken added, tool calls aside: what a stream checked as it flows
        reads. A field's words count once, whether they came in deltas or whole in an event that opens or closes
        the part (then only what no delta said before)."""

    @property
    def opaque(self) -> bool:
        """Whether the event last taken carries part of the answer its words do not say: a tool call, audio data,
        an output the check cannot read. A stream checked as it flows holds such an event until its verdict."""

    def add(self, event: Event) -> bool:
        """Take one event; True when it is the stream's last, which is held back until the verdict is known.
        Raises ProxyError for an event that breaks the stream."""

    def finish(self) -> None:
        """Raises ProxyError when the stream ended before its answer did."""

    def response(self) -> dict[str, Any] | None:
        """The whole response the events make, in the dialect's shape; None where it cannot be read."""

    def completion(self) -> dict[str, Any]:
        """The answer to check: from the whole response, or, where that cannot be read, from the text deltas
        (they have gone out to the client, so they are checked all the same)."""


class Dialect(Protocol):
    name: str  # the route's last path segment, and the path upstream
    provider: str | None  # the provider its spans name; None: the configured upstream provider
    can_reask: bool  # the request can be sent again with an instruction added (`regenerate`)
    via_litellm: bool  # a model a litellm route names goes to that provider (`proxy.litellm_routes`)

    def read(self, raw: bytes) -> dict[str, Any]:
        """The request body, parsed and validated (400 otherwise)."""

    def chat_view(self, body: dict[str, Any]) -> dict[str, Any]:
        """The request as a chat (`messages`, `model`, `stream`, our field): what context extraction reads."""

    def completion(self, response: Any) -> dict[str, Any]:
        """The answer as a chat completion, every field that carries the model's words translated (502 when
        the response is not one of this API's)."""

    def usage(self, response: dict[str, Any]) -> Usage: ...

    def written(self, response: dict[str, Any], checked: dict[str, Any], blocked: bool) -> dict[str, Any]:
        """The response with what policy made of its completion (`checked`) written back."""

    def assembly(self) -> Assembly:
        """The one reader of this API's stream: each event's words as it passes, the whole answer at the end."""

    def replay(self, response: dict[str, Any]) -> list[Event]:
        """A stream that says what `response` says, its last event last."""

    def refused_ending(self, sent: Sequence[Event], text: str) -> list[Event]:
        """The events that end a stream, after the events `sent`, as the provider ends an answer it refuses,
        saying `text`: what the official SDKs read as a refusal, ending normally. Its last event is the
        stream's last (the one `with_verdict` takes)."""

    def with_verdict(self, last: Event | None, verdict: dict[str, Any],
                     response: dict[str, Any] | None) -> list[Event]:
        """The stream's ending with the verdict on it: the verdict's own event, then `last` (the held-back
        last event) carrying it too where it can; `response` is the stream's (its id and model)."""

    def stream_error(self, error: ProxyError) -> Event:
        """The event that tells the client a stream broke after its status line went out."""


# --- helpers of the dialects that translate to and from the chat shape ----------------------------------------

VERDICT_EVENT = "morphguard.verdict"  # the event a Responses or Messages stream gets the verdict in


def text_of(content: Any, kinds: tuple[str, ...]) -> str:
    """The text of a content that is a string or a list of typed parts (those of `kinds`)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content
                         if isinstance(p, dict) and p.get("type") in kinds and isinstance(p.get("text"), str))
    return ""


def chat_request(body: dict[str, Any], messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat-shaped request the context extractor and policy read. The tools it offers go with it as the API
    wrote them: what policy needs to know is that the answer may be a tool call (`stream_modes.stream_mode`)."""
    view: dict[str, Any] = {"messages": messages}
    for key in ("model", "stream", "tools", OUR_FIELD):
        if key in body:
            view[key] = body[key]
    return view


def chat_message(text: str, refusals: list[str], calls: list[dict[str, Any]], unread: list[str]) -> dict[str, Any]:
    """An answer as a chat message (`policy.answers`), with the output types the check cannot read named."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if refusals:
        message["refusal"] = "\n".join(refusals)
    if calls:
        message["tool_calls"] = calls
    if unread:
        message[UNREADABLE] = unread
    return message


def api_error_event(error: ProxyError) -> Event:
    """The `error` event both Responses and Messages streams end with when they break."""
    return event_of("error", {"type": "error", "error": {"type": "api_error", "message": error.message}})


class NamedEvents(Protocol):
    """What `EventLog` needs of a dialect whose stream ends in a named last event."""

    def added(self, event: Event, said: dict[Any, list[str]]) -> str:
        """The words `event` adds to the answer, given what was `said` so far in each part, in the pieces it
        came in (updated)."""

    def is_last(self, event: Event) -> bool: ...

    def opaque(self, event: Event) -> bool:
        """Whether `event` carries part of the answer other than its words (`Assembly.opaque`)."""

    def collected(self, events: list[Event]) -> dict[str, Any] | None: ...

    def completion(self, response: Any) -> dict[str, Any]: ...

    def transcript(self, said: dict[Any, list[str]]) -> str:
        """The words of a spoken answer the events carried (`said`), which no response holds: checked with it."""

    def disagrees(self, events: list[Event], said: dict[Any, list[str]], text: str) -> str | None:
        """Where the stream's last event (`events[-1]`) makes an answer other than the one its events carried to the
        client (`said`, `text`: as `added` read them): what differs; None where they agree."""


class EventLog:
    """A stream kept whole as its events pass; the response is what its events assemble."""

    def __init__(self, dialect: NamedEvents) -> None:
        self.dialect = dialect
        self.events: list[Event] = []
        self.parts: list[str] = []
        self.said: dict[Any, list[str]] = {}  # each part's words so far, in pieces, by the dialect's key
        self.added = ""
        self.opaque = False
        self.last: Event | None = None

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def add(self, event: Event) -> bool:
        self.events.append(event)
        self.added = ""
        self.opaque = False
        if self.dialect.is_last(event):
            differs = self.dialect.disagrees(self.events, self.said, self.text)
            if differs is not None:  # what the client read and what would be checked must be one answer
                raise upstream_malformed(f"the stream's events disagree: {differs}")
            self.last = event
            return True
        self.added = self.dialect.added(event, self.said)
        self.opaque = self.dialect.opaque(event)
        self.parts.append(self.added)
        return False

    def finish(self) -> None:
        if self.last is None:
            raise upstream_stream_broken("the stream ended before its last event")

    def response(self) -> dict[str, Any] | None:
        return self.dialect.collected(self.events)

    def completion(self) -> dict[str, Any]:
        collected = self.response()
        if collected is not None:
            try:
                completion = self.dialect.completion(collected)
            except ProxyError:
                pass
            else:
                spoken = self.dialect.transcript(self.said)
                if spoken:
                    message_of(completion)["audio"] = {"transcript": spoken}
                return completion
        return as_completion({"role": "assistant", "content": self.text})


class EventDialect:
    """What the Responses and Messages dialects share: a JSON object for a body, an answer read and rewritten in
    the dialect's own shape, a stream of named events. A subclass says how to read, rewrite and replay one."""

    @staticmethod
    def answer(response: Any) -> dict[str, Any]:
        raise NotImplementedError

    @staticmethod
    def rewrite(response: dict[str, Any], text: str, blocked: bool) -> dict[str, Any]:
        raise NotImplementedError

    @staticmethod
    def synthesize(response: dict[str, Any]) -> Iterator[Event]:
        raise NotImplementedError

    @staticmethod
    def added(event: Event, said: dict[Any, list[str]]) -> str:
        raise NotImplementedError

    @staticmethod
    def is_last(event: Event) -> bool:
        raise NotImplementedError

    @staticmethod
    def opaque(event: Event) -> bool:
        raise NotImplementedError

    @staticmethod
    def collected(events: list[Event]) -> dict[str, Any] | None:
        raise NotImplementedError

    @staticmethod
    def attach(event: Event, verdict: dict[str, Any]) -> Event:
        raise NotImplementedError

    @staticmethod
    def disagrees(events: list[Event], said: dict[Any, list[str]], text: str) -> str | None:
        raise NotImplementedError

    @staticmethod
    def transcript(said: dict[Any, list[str]]) -> str:
        return ""

    @classmethod
    def with_verdict(cls, last: Event | None, verdict: dict[str, Any],
                     response: dict[str, Any] | None) -> list[Event]:
        ours = event_of(VERDICT_EVENT, {"type": VERDICT_EVENT, OUR_FIELD: verdict})
        return [ours] if last is None else [ours, cls.attach(last, verdict)]

    @staticmethod
    def stream_error(error: ProxyError) -> Event:
        return api_error_event(error)

    @staticmethod
    def read(raw: bytes) -> dict[str, Any]:
        return parse_object(raw)

    @classmethod
    def completion(cls, response: Any) -> dict[str, Any]:
        return as_completion(cls.answer(response))

    @staticmethod
    def usage(response: dict[str, Any]) -> Usage:
        usage: dict[str, Any] = response["usage"] if isinstance(response.get("usage"), dict) else {}
        model = response.get("model")
        return Usage(model if isinstance(model, str) else None, int_or_none(usage.get("input_tokens")),
                     int_or_none(usage.get("output_tokens")))

    @classmethod
    def written(cls, response: dict[str, Any], checked: dict[str, Any], blocked: bool) -> dict[str, Any]:
        text = prose(checked)
        if not blocked and text == cls.answer(response)["content"]:
            return response
        return cls.rewrite(response, text, blocked)

    @classmethod
    def assembly(cls) -> EventLog:
        return EventLog(cls)

    @classmethod
    def replay(cls, response: dict[str, Any]) -> list[Event]:
        return list(cls.synthesize({k: v for k, v in response.items() if k != OUR_FIELD}))

