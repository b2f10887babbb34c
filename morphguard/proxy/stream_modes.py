"""The stream modes (`proxy.stream_mode`), one strategy each over any dialect.

- `passthrough` and `async` (`Relayed`): events go out as they come; the dialect's last event is held back
  until the verdict is known (checked now, or queued) and goes out after it, carrying it too.
- `buffer` (`Buffered`): the whole stream is collected and checked first; a changed answer goes out as the
  stream the dialect replays of it.
- `incremental` (`AsItFlows`): events go out once the answer up to their text passed the whole-answer check
  (`proxy.incremental`); a check that blocks ends the stream, over text still held, as the dialect ends a refused
  answer.
- `auto` (`AsItFlows` too): incremental where the request's rule can change the answer, else passthrough (async under
  `proxy.mode: async`).

A stream that breaks after its 200 ends with the dialect's error event; one a client leaves is still audited.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, aclosing
from typing import Any

from starlette.responses import Response, StreamingResponse

from morphguard.config import Action, ProxySettings
from morphguard.policy.answers import prose
from morphguard.policy.engine import ACTIONS
from morphguard.proxy.backend import Relay
from morphguard.proxy.check import CheckRequest
from morphguard.proxy.context import OUR_FIELD
from morphguard.proxy.dialects.base import Assembly, Dialect, Event, event_of
from morphguard.proxy.errors import ProxyError, upstream_malformed
from morphguard.proxy.exchange import Exchange, Steps, StreamMode
from morphguard.proxy.incremental import Closing, GuardChecks, Incremental

log = logging.getLogger(__name__)


class Relayed:
    def __init__(self, *, later: bool) -> None:
        self.later = later  # queue the check (async) rather than run it before the stream's end

    async def respond(self, steps: Steps, exchange: Exchange, relay: Relay, opened: AsyncExitStack) -> Response:
        return StreamingResponse(self._events(steps, exchange, relay, opened), media_type="text/event-stream",
                                 headers=relay.kept)

    async def _events(self, steps: Steps, exchange: Exchange, relay: Relay,
                      opened: AsyncExitStack) -> AsyncIterator[bytes]:
        assert relay.events is not None
        dialect, guard = exchange.dialect, steps.guard
        assembly = dialect.assembly()
        last: Event | None = None
        recorded = False  # a client that leaves mid-stream cancels us; its row is written all the same
        try:
            try:
                try:
                    async for event in relay.events:
                        if assembly.add(event):
                            last = event
                            break
                        yield event.encode()
                    assembly.finish()
                finally:
                    await opened.aclose()
            except ProxyError as exc:  # the status line is sent: say it in the stream, the SDK raises it
                relay.failed(exc.code or "stream_error")
                log.warning("request %s: upstream stream failed: %s", exchange.intake.request_id, exc.message)
                await guard.account(exchange.intake, exc.code or "upstream_stream_broken", assembly.text)
                recorded = True
                yield dialect.stream_error(exc).encode()
                return
            response, completion = assembly.response(), assembly.completion()
            steps.backend.record(dialect, relay, response, prose(completion))
            try:
                _, record = await steps.check(exchange, relay, response, completion, can_change=False,
                                              later=self.later)
                recorded = True
            finally:
                relay.end()
            for event in dialect.with_verdict(last, record.payload(), response):
                yield event.encode()
        finally:
            if not recorded:
                if relay.span.is_recording():
                    relay.span.end()
                guard.account_soon(exchange.intake, "client_disconnected", assembly.text)


class Buffered:
    async def respond(self, steps: Steps, exchange: Exchange, relay: Relay, opened: AsyncExitStack) -> Response:
        assert relay.events is not None
        dialect = exchange.dialect
        assembly = dialect.assembly()
        held: list[Event] = []
        last: Event | None = None
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
        finally:
            await opened.aclose()
        try:
            response = assembly.response()
            if response is None:
                raise upstream_malformed("the stream does not make a whole response")
            completion = dialect.completion(response)
        except BaseException:
            relay.end()
            raise
        steps.backend.record(dialect, relay, response, prose(completion))
        try:
            checked, record = await steps.check(exchange, relay, response, completion, can_change=True, later=False)
        finally:
            relay.end()
        assert checked is not None
        if record.action == "block" or dialect.completion(checked) != completion:
            *held, last = dialect.replay(checked)
        out = [e.encode() for e in [*held, *dialect.with_verdict(last, record.payload(), response)]]
        return StreamingResponse(iter(out), media_type="text/event-stream", headers=relay.kept | record.headers())


class AsItFlows:
    """Checked as it flows (`incremental`), or, under `auto`, where the rule can change the answer; the mode
    `stream_mode` chooses otherwise."""

    async def respond(self, steps: Steps, exchange: Exchange, relay: Relay, opened: AsyncExitStack) -> Response:
        guard, intake = steps.guard, exchange.intake
        name = stream_mode(guard.settings, guard.engine.rule(intake.profile, intake.topic).action, intake,
                           tool_calls_checked=guard.config.policy.tool_calls == "check")
        if name != "incremental":
            return await STREAM_MODES[name].respond(steps, exchange, relay, opened)
        return StreamingResponse(self._events(steps, exchange, relay, opened), media_type="text/event-stream",
                                 headers=relay.kept)

    async def _events(self, steps: Steps, exchange: Exchange, relay: Relay,
                      opened: AsyncExitStack) -> AsyncIterator[bytes]:
        assert relay.events is not None
        dialect, guard = exchange.dialect, steps.guard
        stream = _DialectStream(dialect)

        async def upstream(events: AsyncIterator[Event]) -> AsyncIterator[Event]:
            async for event in stream.read(events):
                yield event
            steps.backend.record(dialect, relay, stream.assembly.response(), prose(stream.assembly.completion()))

        checks = GuardChecks(guard, exchange.intake, lambda text: stream.assembly.completion())
        engine = Incremental(stream, checks, guard.settings.stream_window)
        unrecorded = "client_disconnected"  # the audit's reason if the stream ends before its verdict is recorded
        try:
            try:
                async with aclosing(engine.run(upstream(relay.events))) as events:
                    async for event in events:
                        yield event.encode()
            finally:
                await opened.aclose()
        except ProxyError as exc:  # unchecked text never left; the dialect's error event ends it, the SDK raises
            relay.failed(exc.code or "stream_error")
            log.warning("request %s: upstream stream failed: %s", exchange.intake.request_id, exc.message)
            unrecorded = ""
            await guard.account(exchange.intake, exc.code or "upstream_stream_broken", stream.assembly.text)
            yield dialect.stream_error(exc).encode()
        except Exception:
            unrecorded = "internal_error"
            raise
        finally:
            relay.end()
            if unrecorded and checks.record is None:
                guard.account_soon(exchange.intake, unrecorded, stream.assembly.text)


class _DialectStream:
    """A dialect's events as the engine reads them (`proxy.incremental.Stream`); the upstream's last event is
    held here, for the ending."""

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        self.assembly: Assembly = dialect.assembly()
        self.last: Event | None = None
        self._added: dict[int, str] = {}  # the words of each event read and not yet asked for, by the event

    async def read(self, events: AsyncIterator[Event]) -> AsyncIterator[Event]:
        """The upstream's events less its last (kept for the ending); ProxyError where the stream breaks."""
        async for event in events:
            if self.assembly.add(event):
                self.last = event
                break
            self._added[id(event)] = self.assembly.added
            yield event
        self.assembly.finish()

    def delta(self, event: Event) -> str:
        """The words the assembly read in `event` as it took it: the stream's one reading of its events."""
        return self._added.pop(id(event), "")

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
        if ACTIONS.index(action) <= ACTIONS.index("annotate"):
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
                                       "buffer": Buffered(), "incremental": AsItFlows(), "auto": AsItFlows()}
