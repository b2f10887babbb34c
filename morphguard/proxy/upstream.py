"""The provider behind the proxy: a pooled httpx client that passes bytes through.

Retries (connection errors, timeouts, 5xx) happen only before a response has started to flow to the
client; a stream that breaks midway is never replayed.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import random
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

import httpx

from morphguard.config import ProxySettings
from morphguard.proxy.errors import (
    ProxyError,
    unauthorized,
    upstream_timeout,
    upstream_unavailable,
)

log = logging.getLogger(__name__)

# Headers that describe one hop, or that httpx sets itself, are not copied across.
HOP_HEADERS = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                         "transfer-encoding", "upgrade", "host", "content-length", "accept-encoding"})


class Upstream:
    def __init__(self, settings: ProxySettings, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.settings = settings.upstream
        self._proxy_keys = [k.get_secret_value().encode() for k in settings.keys]
        limits = httpx.Limits(max_connections=self.settings.max_connections)
        self.client = httpx.AsyncClient(base_url=self.settings.base_url.rstrip("/") + "/",
                                        timeout=httpx.Timeout(self.settings.timeout_s, connect=10.0),
                                        limits=limits, transport=transport)

    async def aclose(self) -> None:
        await self.client.aclose()

    def headers_for(self, incoming: Mapping[str, str]) -> dict[str, str]:
        """The headers to send upstream; checks the client's proxy key when we inject our own upstream key."""
        headers = {k: v for k, v in incoming.items()
                   if k.lower() not in HOP_HEADERS and not k.lower().startswith("x-morphguard-")}
        if self.settings.api_key is None:
            return headers  # the client's own Authorization goes through
        presented = incoming.get("authorization", "").removeprefix("Bearer ").strip().encode()
        if not any(hmac.compare_digest(presented, key) for key in self._proxy_keys):
            raise unauthorized()
        headers = {k: v for k, v in headers.items() if k.lower() not in ("authorization", "api-key")}
        headers["authorization"] = f"Bearer {self.settings.api_key.get_secret_value()}"
        return headers

    @asynccontextmanager
    async def open(self, method: str, path: str, headers: Mapping[str, str], content: bytes | None,
                   params: Mapping[str, str] | None = None) -> AsyncIterator[httpx.Response]:
        """Send and yield the response with its body unread; retried until the response has started."""
        request = self.client.build_request(method, path.lstrip("/"), headers=headers, content=content,
                                            params=params)
        response = await self._send_with_retries(request)
        try:
            yield response
        finally:
            await response.aclose()

    async def _send_with_retries(self, request: httpx.Request) -> httpx.Response:
        attempts = self.settings.max_attempts
        for attempt in range(1, attempts + 1):
            try:
                response = await self.client.send(request, stream=True)
            except httpx.TimeoutException:
                failure: ProxyError = upstream_timeout()
            except httpx.TransportError as exc:
                failure = upstream_unavailable(type(exc).__name__)
            else:
                if response.status_code < 500 or attempt == attempts:
                    if response.status_code >= 500:
                        await response.aclose()
                        raise upstream_unavailable(f"HTTP {response.status_code}")
                    return response
                await response.aclose()
                failure = upstream_unavailable(f"HTTP {response.status_code}")
            if attempt == attempts:
                raise failure
            log.warning("upstream attempt %d/%d failed: %s", attempt, attempts, failure.message)
            await asyncio.sleep(min(4.0, 0.2 * 2 ** attempt) * random.uniform(0.5, 1.0))
        raise AssertionError("unreachable")  # pragma: no cover
