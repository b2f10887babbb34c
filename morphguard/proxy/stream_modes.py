"""The stream modes (`proxy.stream_mode`), one strategy each over any dialect.

- `passthrough` and `async` (`Relayed`): events go out as they come; the dialect's last event is held back
  until the verdict is known (checked now, or queued) and goes out after it, carrying it too.
- `buffer` (`Buffered`): the whole stream is collected and checked first, the only mode that can change the
  answer; a changed answer goes out as the stream the dialect replays of it.

A stream that breaks after its 200 ends with the dialect's error event; one a client leaves is still audited.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

from starlette.responses import Response, StreamingResponse

from morphguard.policy.answers import prose
from morphguard.proxy.backend import Relay
from morphguard.proxy.dialects.base import Event
from morphguard.proxy.errors import ProxyError, upstream_malformed
from morphguard.proxy.exchange import Exchange, Steps, StreamMode

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


STREAM_MODES: dict[str, StreamMode] = {"passthrough": Relayed(later=False), "async": Relayed(later=True),
                                       "buffer": Buffered()}
