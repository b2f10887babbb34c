"""What every request must satisfy before a route sees it: one canonical path, unambiguous headers.

The path a client sends is hostile input. Routing on it as sent let `/v1//chat/completions`,
`/v1/./chat/completions` or `/v1/chat/completions/` miss the checked route and reach the provider as an
ordinary generation. Here the path is rewritten to its canonical form (empty and `.` segments dropped,
no trailing slash) and anything that cannot be made canonical without guessing (`..`, control
characters, backslashes) is refused, so every later decision sees the path the upstream would see.

Headers that decide who the client is or which policy applies must appear once: with two
`Authorization` headers, one part of a stack may authenticate the first and another route on the last. For the same
reason a request may present one key: `Authorization`, `x-api-key` and `api-key` naming two different keys are
refused, since policy would route by one while the provider authenticates by the other.

`GET /metrics` needs the bearer token `telemetry.metrics_token` when one is configured (401 otherwise), checked
here, on the canonical path, before any route runs. `credentials.bearer_token` is the one reading of `Authorization`.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from morphguard.proxy.credentials import KEY_HEADERS, bearer_token, two_keys
from morphguard.proxy.errors import ProxyError, bad_request, json_bytes, metrics_unauthorized
from morphguard.telemetry import setup as telemetry_setup

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# Headers that authenticate, select policy or frame the body: a second copy is refused, never merged.
_SINGLE = frozenset({"authorization", "api-key", "x-api-key", "content-length", "content-type", "host",
                     "transfer-encoding"})
_OURS = "x-morphguard-"
METRICS_PATH = "/metrics"


def may_scrape(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether a request may read /metrics: no token configured, or the token presented, compared in constant time
    (both sides hashed first, so that not even the token's length shows in the timing)."""
    token = telemetry_setup.metrics_token
    if token is None:
        return True
    authorization = next((v for k, v in headers if k.lower() == b"authorization"), b"").decode("latin-1")
    presented = bearer_token(authorization)
    if presented is None:
        return False
    return hmac.compare_digest(hashlib.sha256(presented.encode("latin-1")).digest(),
                               hashlib.sha256(token.get_secret_value().encode("utf-8")).digest())


def canonical_path(path: str) -> str:
    """`path` with empty and `.` segments dropped; ProxyError 400 for what has no safe canonical form."""
    if any(ch < " " or ch == "\x7f" or ch == "\\" for ch in path):
        raise bad_request("The request path contains control characters or backslashes.")
    segments = [s for s in path.split("/") if s and s != "."]
    if ".." in segments:
        raise bad_request("The request path may not contain '..' segments.")
    return "/" + "/".join(segments)


class Gate:
    """ASGI middleware: canonical `path`/`raw_path`, refused duplicates, OpenAI-shaped 400s."""

    def __init__(self, app: ASGIApp, extra_single: frozenset[str] = frozenset()) -> None:
        self.app = app
        self.single = _SINGLE | {h.lower() for h in extra_single}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            path = canonical_path(scope["path"])
            duplicate = self._duplicate(scope.get("headers", []))
            if duplicate:
                raise bad_request(f"The header '{duplicate}' was sent more than once.")
            if two_keys(_keys(scope.get("headers", []))):
                raise bad_request("The request presents two different keys (in Authorization, x-api-key or "
                                  "api-key): send one.")
            if path == METRICS_PATH and not may_scrape(scope.get("headers", [])):
                raise metrics_unauthorized()
        except ProxyError as exc:
            await refuse(send, exc)
            return
        if path != scope["path"]:
            scope = {**scope, "path": path, "raw_path": path.encode()}
        await self.app(scope, receive, send)

    def _duplicate(self, headers: list[tuple[bytes, bytes]]) -> str | None:
        seen: set[str] = set()
        for raw, _ in headers:
            name = raw.decode("latin-1").lower()
            if name in seen and (name in self.single or name.startswith(_OURS)):
                return name
            seen.add(name)
        return None


def _keys(headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """The headers that can carry a key, by lower-case name (each appears once by now)."""
    wanted = {name.encode() for name in KEY_HEADERS}
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in headers if k.lower() in wanted}


async def refuse(send: Send, error: ProxyError) -> None:
    """Answer with an error before any route ran (the body is not read)."""
    body = json_bytes(error.payload())
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in error.headers.items()]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
