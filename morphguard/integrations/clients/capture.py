"""The verdict of each answer, taken off the wire by an httpx event hook.

Every client apps use here (openai, anthropic, LangChain, LlamaIndex, the Agents SDK) talks HTTP through an
httpx client it can be given (anthropic's: an `httpx2` client, the same hooks). `VerdictCapture` hooks into
that client and reads the proxy's `morphguard` object from each answer as the client reads it: the body
field of an answer, the verdict chunk or event of a stream. A client or framework that drops the field on
its way to the app (LangChain, LlamaIndex, the SDKs' stream helpers, the Agents SDK) leaves it here.

    capture = VerdictCapture()
    client = openai.OpenAI(base_url=..., http_client=httpx.Client(event_hooks=capture.hooks))
    ...
    capture.last            # the verdict of the latest answer
    capture.of(request_id)  # or of one answer, by its `x-morphguard-request-id`
"""

from __future__ import annotations

import json
import sys
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from functools import cache
from types import ModuleType
from typing import Any

FIELD = "morphguard"
REQUEST_ID = "x-morphguard-request-id"


def verdict_of(obj: Any) -> dict[str, Any] | None:
    """The verdict an SDK object carries in its `morphguard` field: a completion, a chunk, a Responses event
    (or the response it closes with), a Messages event, or their JSON as a dict; None when it has none."""
    if isinstance(obj, Mapping):
        found, inner = obj.get(FIELD), obj.get("response")
    else:
        found, inner = (getattr(obj, "model_extra", None) or {}).get(FIELD), getattr(obj, "response", None)
    if found is None and inner is not None:  # response.completed and the like: the verdict is in the response
        return verdict_of(inner)
    return found if isinstance(found, dict) else None


class VerdictCapture:
    """Verdicts of the answers an httpx client receives, kept by request id (the latest `keep` of them)."""

    def __init__(self, keep: int = 1000) -> None:
        self._keep = keep
        self._by_id: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.last: dict[str, Any] | None = None

    @property
    def hooks(self) -> dict[str, list[Callable[[Any], Any]]]:
        """`event_hooks` for an `httpx.Client` (or `httpx2.Client`)."""
        return {"response": [self._tap]}

    @property
    def async_hooks(self) -> dict[str, list[Callable[[Any], Any]]]:
        """`event_hooks` for an `httpx.AsyncClient` (or `httpx2.AsyncClient`)."""

        async def tap(response: Any) -> None:
            self._tap(response)

        return {"response": [tap]}

    def of(self, request_id: str) -> dict[str, Any] | None:
        return self._by_id.get(request_id)

    def _tap(self, response: Any) -> None:
        """Read the body as it passes (never consuming it): the client still gets every byte."""
        request_id = response.headers.get(REQUEST_ID)
        if response.headers.get("content-encoding", "identity") != "identity":
            return  # compressed: the proxy writes its answers plain, so this is not one of them
        reader = _Reader(response.headers.get("content-type", ""), lambda v: self._found(request_id, v))
        http = sys.modules[type(response).__module__.partition(".")[0]]
        sync_tap, async_tap = _taps(http)
        if isinstance(response.stream, http.SyncByteStream):
            response.stream = sync_tap(response.stream, reader)
        elif isinstance(response.stream, http.AsyncByteStream):
            response.stream = async_tap(response.stream, reader)

    def _found(self, request_id: str | None, verdict: dict[str, Any]) -> None:
        self.last = verdict
        key = request_id or str(verdict.get("request_id", ""))
        if key:
            self._by_id[key] = verdict
            self._by_id.move_to_end(key)
            while len(self._by_id) > self._keep:
                self._by_id.popitem(last=False)


class _Reader:
    """Finds the verdict in a body read piece by piece: in the whole JSON of an answer, or in the `data:` line
    of a server-sent event that carries the field."""

    def __init__(self, content_type: str, found: Callable[[dict[str, Any]], None]) -> None:
        self.events = content_type.startswith("text/event-stream")
        self.json = "json" in content_type
        self.found = found
        self.pending = b""

    def feed(self, part: bytes) -> None:
        if not (self.events or self.json):
            return
        self.pending += part
        if self.events:
            *lines, self.pending = self.pending.split(b"\n")
            for line in lines:
                self._event_line(line)

    def end(self) -> None:
        if self.events:
            self._event_line(self.pending)
        elif self.json:
            self._take(self.pending)
        self.pending = b""

    def _event_line(self, line: bytes) -> None:
        if line.startswith(b"data:") and FIELD.encode() in line:
            self._take(line[5:])

    def _take(self, data: bytes) -> None:
        try:
            verdict = verdict_of(json.loads(data))
        except ValueError:
            return
        if verdict is not None:
            self.found(verdict)


@cache
def _taps(http: ModuleType) -> tuple[type, type]:
    """Byte streams that pass a body on while `_Reader` reads it, for the HTTP library `http` (httpx, or the
    httpx2 that anthropic's client is built on: the same interface, its own classes)."""

    class SyncTap(http.SyncByteStream):  # type: ignore[name-defined]
        def __init__(self, inner: Any, reader: _Reader) -> None:
            self.inner, self.reader = inner, reader

        def __iter__(self) -> Iterator[bytes]:
            for part in self.inner:
                self.reader.feed(part)
                yield part
            self.reader.end()

        def close(self) -> None:
            self.inner.close()

    class AsyncTap(http.AsyncByteStream):  # type: ignore[name-defined]
        def __init__(self, inner: Any, reader: _Reader) -> None:
            self.inner, self.reader = inner, reader

        async def __aiter__(self) -> AsyncIterator[bytes]:
            async for part in self.inner:
                self.reader.feed(part)
                yield part
            self.reader.end()

        async def aclose(self) -> None:
            await self.inner.aclose()

    return SyncTap, AsyncTap
