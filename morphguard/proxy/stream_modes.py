"""The stream modes (`proxy.stream_mode`), one strategy each over any dialect.

- `passthrough` and `async` (`Relayed`): events go out as they come; the dialect's last event is held back
  until the verdict is known (checked now, or queued) and goes out after it, carrying it too.
- `buffer` (`Buffered`): the whole stream is collected and checked first; a changed answer goes out as the
  stream the dialect replays of it.
- `incremental` (`AsItFlows`): events go out once the answer up to their text passed the whole-answer check
  (`settle.incremental`); a check that blocks ends the stream, over text still held, as the dialect ends a refused
  answer.
- `auto` is no mode of its own: `stream_mode` picks one of these per request (incremental where policy can change the
  answer, else passthrough, or async under `proxy.mode: async`).

Each mode names itself in the response's `x-morphguard-stream` header, and runs the request path only through the
`Steps` it is given (`proxy.exchange`). A stream that breaks after its 200 ends with the dialect's error event; one a
client leaves is still audited.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, aclosing
from typing import Any

from starlette.responses import Response, StreamingResponse

from morphguard.config import Action, ProxySettings
from morphguard.policy.engine import Reach, changes_answer
from morphguard.proxy.backend import Relay
from morphguard.proxy.context import OUR_FIELD
from morphguard.proxy.dialects.base import Assembly, Dialect, Event, event_of
from morphguard.proxy.errors import ProxyError, upstream_malformed
from morphguard.proxy.exchange import Exchange, Steps, StreamMode
from morphguard.settle.incremental import Closing
from morphguard.settle.values import Answer, CheckRequest

log = logging.getLogger(__name__)
STREAM_HEADER = "x-morphguard-stream"  # the mode a stream ran in: passthrough, async, buffer or incremental


class Relayed:
    def __init__(self, *, later: bool) -> None:
        self.later = later  # queue the check (async) rather than run it before the stream's end
        self.name = "async" if later else "passthrough"

    async def respond(self, steps: Steps, exchange: Exchange, relay: Relay, opened: AsyncExitStack) -> Response:
        return StreamingResponse(self._events(steps, exchange, relay, opened), media_type="text/event-stream",
                                 headers=relay.kept | {STREAM_HEADER: self.name})

    async def _events(self, steps: Steps, exchange: Exchange, relay: Relay,
                      opened: AsyncExitStack) -> AsyncIterator[bytes]:
        assert relay.events is not None
        dialect = exchange.dialect
        assembly = dialect.assembly()
        last: Event | None = None
        recorded = False  # a client that leaves mid-stream cancels us; its row is written all the same
        broken: ProxyError | None = None
        sent = 0  # characters of answer text the client was sent
        streaming = steps.stream(exchange)
        try:
            try:
                async for event in relay.events:
                    if assembly.add(event):
                        last = event
                        break
                    chars = len(assembly.added)
                    streaming.sending(sent)
                    yield event.encode()
                    sent += chars
                assembly.finish()
            except ProxyError as exc:
                relay.failed(exc.code or "stream_error")
                broken = exc
            finally:
                await opened.aclose()  # the provider's stream and its span: read to the end
            if broken is not None:  # the status line is sent: say it in the stream, the SDK raises it
                log.warning("request %s: upstream stream failed: %s", exchange.intake.request_id, broken.message)
                await streaming.account(broken.code or "upstream_stream_broken", assembly.text)
                recorded = True
                yield dialect.stream_error(broken).encode()
                return
            response, completion = assembly.response(), assembly.completion()
            answer = Answer(completion, response)
            steps.answered(exchange, relay, answer)
            try:
                if self.later:
                    settled = await steps.check_later(exchange, answer, Reach.NONE)
                else:
                    settled = await steps.check(exchange, answer, Reach.NONE)
            except ProxyError as exc:  # the verdict cannot be given (its row cannot be written): say so, the SDK raises
                recorded = True
                streaming.owed()
                yield dialect.stream_error(exc).encode()
                return
            recorded = True
            for event in dialect.with_verdict(last, settled.record.payload(), response):
                yield event.encode()
        finally:
            if not recorded:
                streaming.left("client_disconnected", assembly.text, sent)
            else:
                streaming.ended()


class Buffered:
    name = "buffer"

    async def respond(self, steps: Steps, exchange: Exchange, relay: Relay, opened: AsyncExitStack) -> Response:
        assert relay.events is not None
        dialect = exchange.dialect
        assembly = dialect.assembly()
        held: list[Event] = []
        last: Event | None = None
        async with opened:  # the provider's stream and its span: read to the end
            try:
                async for event in relay.events:
                    if assembly.add(event):
                        last = event
                        break
                    held.append(event)
                assembly.finish()
            except BaseException as exc:
                relay.failed(type(exc).__name__)
                raise
            response = assembly.response()
            if response is None:
                raise upstream_malformed("the stream does not make a whole response")
            dialect.completion(response)  # a whole response its API's reader rejects is a 502: nothing went out yet
            answer = Answer(assembly.completion(), response)  # with what only the events said (a transcript)
            steps.answered(exchange, relay, answer)
        settled = await steps.check(exchange, answer, Reach.REWRITE)
        checked, record = settled.answer, settled.record
        assert checked.response is not None
        if record.action == "block" or checked.completion != answer.completion:
            *held, last = dialect.replay(checked.response)
        out = [e.encode() for e in [*held, *dialect.with_verdict(last, record.payload(), response)]]
        return StreamingResponse(iter(out), media_type="text/event-stream",
                                 headers=relay.kept | record.headers() | {STREAM_HEADER: self.name})


class AsItFlows:
    """Checked as it flows (`incremental`): text released as the prefixes it lies in pass the check, what the check
    cannot read held until the stream's verdict (`settle.incremental`)."""

    name = "incremental"

    async def respond(self, steps: Steps, exchange: Exchange, relay: Relay, opened: AsyncExitStack) -> Response:
        return StreamingResponse(self._events(steps, exchange, relay, opened), media_type="text/event-stream",
                                 headers=relay.kept | {STREAM_HEADER: self.name})

    async def _events(self, steps: Steps, exchange: Exchange, relay: Relay,
                      opened: AsyncExitStack) -> AsyncIterator[bytes]:
        assert relay.events is not None
        dialect = exchange.dialect
        stream = _DialectStream(dialect)

        def whole() -> Answer:
            return Answer(stream.assembly.completion(), stream.assembly.response())

        async def upstream(events: AsyncIterator[Event]) -> AsyncIterator[Event]:
            async for event in stream.read(events):
                yield event
            steps.answered(exchange, relay, whole())

        streaming = steps.stream(exchange)
        engine = streaming.flowing(stream, whole)
        unrecorded = "client_disconnected"  # the audit's reason if the stream ends before its verdict is recorded
        try:
            try:
                async with aclosing(engine.run(upstream(relay.events))) as events:
                    async for event in events:
                        streaming.sending(engine.released)
                        yield event.encode()
            except ProxyError as exc:  # unchecked text never left; the dialect's error event ends it, the SDK raises
                relay.failed(exc.code or "stream_error")
                await opened.aclose()
                log.warning("request %s: upstream stream failed: %s", exchange.intake.request_id, exc.message)
                unrecorded = ""
                await streaming.account(exc.code or "upstream_stream_broken", stream.assembly.text)
                yield dialect.stream_error(exc).encode()
            except Exception:
                unrecorded = "internal_error"
                raise
        finally:
            await opened.aclose()
            if unrecorded and not streaming.closed:
                streaming.left(unrecorded, stream.assembly.text, engine.sent)
            else:
                streaming.ended()


class _DialectStream:
    """A dialect's events as the engine reads them (`settle.incremental.Stream`); the upstream's last event is
    held here, for the ending."""

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        self.assembly: Assembly = dialect.assembly()
        self.last: Event | None = None
        self._added: dict[int, str] = {}  # the words of each event read and not yet asked for, by the event
        self._opaque: set[int] = set()  # the events read that carry what the check cannot read as text

    async def read(self, events: AsyncIterator[Event]) -> AsyncIterator[Event]:
        """The upstream's events less its last (kept for the ending); ProxyError where the stream breaks."""
        async for event in events:
            if self.assembly.add(event):
                self.last = event
                break
            self._added[id(event)] = self.assembly.added
            if self.assembly.opaque:
                self._opaque.add(id(event))
            yield event
        self.assembly.finish()

    def delta(self, event: Event) -> str:
        """The words the assembly read in `event` as it took it: the stream's one reading of its events."""
        return self._added.pop(id(event), "")

    def opaque(self, event: Event) -> bool:
        """Whether the assembly found in `event`, as it took it, answer content other than words."""
        if id(event) in self._opaque:
            self._opaque.discard(id(event))
            return True
        return False

    def marked(self, event: Event, verdict: dict[str, Any]) -> Event:
        data = event.json()  # every API's events are JSON objects; an SDK keeps a field it does not know
        return event_of(event.name, {**data, OUR_FIELD: verdict}) if isinstance(data, dict) else event

    def ending(self, sent: Sequence[Event], closing: Closing) -> list[Event]:
        last = self.last
        body: list[Event] = []
        if closing.blocks:
            *body, last = self.dialect.refused_ending(sent, closing.notice)
        return [*body, *self.dialect.with_verdict(last, closing.verdict, self.assembly.response())]


def stream_mode(settings: ProxySettings, action: Action, request: CheckRequest, *, tool_calls_checked: bool) -> str:
    """How one request's stream is checked. `auto`: as it flows where the request's rule can change the answer
    (a stronger action than `annotate`), else passed through (queued under `mode: async`). Checking as it flows
    reads answer text only, so a request that offers tools whose calls are checked is buffered, on every API; one
    with no context has nothing to be checked against and passes through (recorded `no_context`)."""
    mode = settings.stream_mode
    if mode == "auto":
        if not changes_answer(action):
            return "async" if settings.mode == "async" else "passthrough"
        mode = "incremental"
    if mode == "incremental":
        if request.rag is None:
            return "passthrough"
        if tool_calls_checked and _offers_tools(request):
            return "buffer"
    return mode


def _offers_tools(request: CheckRequest) -> bool:
    """Whether the answer may be a tool call: the request as a chat (each dialect's `chat_view`) offers tools, or
    chat's legacy functions."""
    return bool(request.body.get("tools") or request.body.get("functions"))


STREAM_MODES: dict[str, StreamMode] = {"passthrough": Relayed(later=False), "async": Relayed(later=True),
                                       "buffer": Buffered(), "incremental": AsItFlows()}
"""The modes by the name `stream_mode` chooses (`auto` is a choice among them, never a mode of its own)."""
