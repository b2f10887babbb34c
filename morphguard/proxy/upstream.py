"""The provider behind the proxy: a pooled httpx client that passes bytes through.

Only the configured upstream is ever reached, under its base path: the caller gives a canonical
relative path (see `gate.canonical_path`), each segment is percent-encoded here, and the final URL is
checked to still sit under the base before anything is sent, so a client path can never name a host.

Retries never resend a request the provider may have processed (a billed generation sent twice):
only connection failures and the explicit "come back later" answers 429 and 503 are retried, with
backoff (honouring a short Retry-After); read timeouts and resets only when `upstream.retry_reads`.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from urllib.parse import quote

import httpx
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_random_exponential,
)

from morphguard.config import ProxySettings
from morphguard.proxy.errors import (
    unauthorized,
    upstream_timeout,
    upstream_unavailable,
)

log = logging.getLogger(__name__)

# Headers that describe one hop, or that httpx sets itself, are not copied across.
HOP_HEADERS = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                         "transfer-encoding", "upgrade", "host", "content-length", "accept-encoding"})
# Also dropped from a response whose body we write ourselves (re-serialised JSON, our own SSE).
_BODY_HEADERS = frozenset({"content-length", "content-encoding", "content-type"})
_COME_BACK_LATER = (429, 503)
_MAX_RETRY_AFTER_S = 5.0
_SEGMENT_SAFE = "-._~:@!$&'()*+,;="


class _Busy(Exception):
    """The provider said 429/503: nothing was processed, another attempt is safe."""

    def __init__(self, retry_after: str | None) -> None:
        super().__init__("busy")
        self.retry_after = retry_after


def response_headers(headers: httpx.Headers, *, rewritten_body: bool) -> dict[str, str]:
    """The provider's response headers worth keeping (rate limits, request ids, Retry-After)."""
    drop = HOP_HEADERS | _BODY_HEADERS if rewritten_body else HOP_HEADERS
    return {k: v for k, v in headers.items() if k.lower() not in drop}


class Upstream:
    def __init__(self, settings: ProxySettings, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.settings = settings.upstream
        self._proxy_keys = [k.get_secret_value().encode() for k in settings.keys]
        self.base = httpx.URL(self.settings.base_url.rstrip("/") + "/")
        self._base_path = self.base.raw_path.split(b"?")[0]
        limits = httpx.Limits(max_connections=self.settings.max_connections)
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(self.settings.timeout_s, connect=10.0),
                                        limits=limits, transport=transport)

    async def aclose(self) -> None:
        await self.client.aclose()

    def url_for(self, path: str) -> httpx.URL:
        """The upstream URL of a canonical relative path such as `chat/completions`."""
        segments = [s for s in path.split("/") if s]
        if any(s in (".", "..") for s in segments):
            raise ValueError(f"not a canonical path: {path!r}")
        url = self.base.copy_with(raw_path=self._base_path + "/".join(quote(s, safe=_SEGMENT_SAFE)
                                                                       for s in segments).encode())
        if (url.scheme, url.host, url.port) != (self.base.scheme, self.base.host, self.base.port) \
                or not url.raw_path.startswith(self._base_path):
            raise ValueError(f"{path!r} leaves the upstream base")
        return url

    def headers_for(self, incoming: Mapping[str, str]) -> dict[str, str]:
        """The headers to send upstream; checks the client's proxy key when we inject our own upstream key."""
        # Values without surrounding whitespace (RFC 9110 5.5), as h11 would have parsed them: httptools keeps it.
        headers = {k: v.strip(" \t") for k, v in incoming.items()
                   if k.lower() not in HOP_HEADERS and not k.lower().startswith("x-morphguard-")}
        if self.settings.api_key is None:
            return headers  # the client's own Authorization goes through
        # Anthropic's clients present their key as x-api-key, OpenAI's as a bearer token.
        presented = (incoming.get("authorization", "").removeprefix("Bearer ").strip()
                     or incoming.get("x-api-key", "").strip()).encode("latin-1")
        if not any(hmac.compare_digest(presented, key) for key in self._proxy_keys):
            raise unauthorized()
        headers = {k: v for k, v in headers.items() if k.lower() not in ("authorization", "api-key", "x-api-key")}
        headers["authorization"] = f"Bearer {self.settings.api_key.get_secret_value()}"
        return headers

    @asynccontextmanager
    async def open(self, method: str, path: str, headers: Mapping[str, str], content: bytes | None,
                   params: Mapping[str, str] | None = None) -> AsyncIterator[httpx.Response]:
        """Send and yield the response with its body unread. 5xx other than a final 503 becomes a 502."""
        # Header values travel as the bytes the client sent (latin-1 is how the server decoded them).
        raw_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        request = self.client.build_request(method, self.url_for(path), headers=raw_headers, content=content,
                                            params=params)
        response = await self._send(request)
        try:
            if response.status_code >= 500:
                raise upstream_unavailable(f"HTTP {response.status_code}",
                                           response_headers(response.headers, rewritten_body=True))
            yield response
        finally:
            await response.aclose()

    def _retryable(self, exc: BaseException) -> bool:
        if isinstance(exc, (_Busy, httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)):
            return True
        return self.settings.retry_reads and isinstance(exc, (httpx.ReadTimeout, httpx.ReadError,
                                                              httpx.RemoteProtocolError))

    @staticmethod
    def _wait(state: RetryCallState) -> float:
        failure = state.outcome.exception() if state.outcome else None
        if isinstance(failure, _Busy) and failure.retry_after:
            try:
                return min(_MAX_RETRY_AFTER_S, max(0.0, float(failure.retry_after)))
            except ValueError:
                pass  # an HTTP date: fall back to our own backoff
        return float(wait_random_exponential(multiplier=0.2, max=4.0)(state))

    async def _send(self, request: httpx.Request) -> httpx.Response:
        attempts = self.settings.max_attempts
        try:
            async for attempt in AsyncRetrying(stop=stop_after_attempt(attempts), wait=self._wait,
                                               retry=retry_if_exception(self._retryable), reraise=True):
                with attempt:
                    response = await self.client.send(request, stream=True)
                    last = attempt.retry_state.attempt_number >= attempts
                    if response.status_code in _COME_BACK_LATER and not last:
                        await response.aclose()
                        log.warning("upstream answered %d (attempt %d/%d)", response.status_code,
                                    attempt.retry_state.attempt_number, attempts)
                        raise _Busy(response.headers.get("retry-after"))
                    return response
        except httpx.TimeoutException:
            raise upstream_timeout() from None
        except httpx.TransportError as exc:
            raise upstream_unavailable(type(exc).__name__) from None
        raise AssertionError("unreachable")  # pragma: no cover


async def read_body(response: httpx.Response) -> bytes:
    """The whole upstream body; a stall is a 504 and a broken connection a 502, never our own 500."""
    try:
        return await response.aread()
    except httpx.TimeoutException:
        raise upstream_timeout() from None
    except httpx.HTTPError as exc:
        raise upstream_unavailable(f"the response body broke off ({type(exc).__name__})") from None
