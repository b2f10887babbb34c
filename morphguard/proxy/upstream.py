"""The provider behind the proxy: a pooled aiohttp client that passes bytes through.

aiohttp rather than httpx, because this call runs once per proxied request on the proxy's own CPU:
`benchmarks/upstream_clients.py` measured 0.20 ms of CPU per call for aiohttp against 0.84 for httpx
and 0.47 for httpcore alone. httpx stays for everything off the hot path (judge probes, webhooks).

Only the configured upstream is ever reached, under its base path: the caller gives a canonical
relative path (see `gate.canonical_path`), each segment is percent-encoded here, and the final URL is
checked to still sit under the base before anything is sent, so a client path can never name a host.
Redirects are never followed and no cookies are kept: a provider's answer cannot send the key
elsewhere, and one client's cookies never reach another client's request. A client's own cookies and the
forwarding headers of a reverse proxy in front are not sent either: they concern the proxy alone; nor do the
provider's cookies reach the client, on whose view they would belong to the proxy's origin.

Retries never resend a request the provider may have processed (a billed generation sent twice):
only connection failures and the explicit "come back later" answers 429 and 503 are retried, with
backoff (honouring a short Retry-After); read timeouts and resets only when `upstream.retry_reads`.

Every wait is bounded (`proxy.upstream`): a request finding every connection busy waits `pool_wait_s`, then gets a
503 `upstream_busy`; a response must begin within `first_byte_s`, never fall silent for `timeout_s` and end within
`response_s` (aiohttp's own total timeout, which also covers reading the body), else 504. Whoever holds a response
open holds its connection: a caller cancelled (a client that left) closes it, and the provider sees the request end.

A streamed body is read as lines of at most `upstream.max_line_bytes`: a longer line is a 502 as soon as
the limit is passed, never held whole. A provider's error body is read with every secret masked (a
provider may echo the key it was sent), in every way it is read, compressed ones included.
"""

from __future__ import annotations

import asyncio
import gzip
import hmac
import logging
import random
import re
import zlib
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from typing import Literal
from urllib.parse import quote

import aiohttp
from yarl import URL

from morphguard import telemetry
from morphguard.config import ProxySettings
from morphguard.masking import add_secrets, config_secrets, mask_secrets_in
from morphguard.proxy.credentials import credentials_in, present_keys, presented_key
from morphguard.proxy.errors import (
    ProxyError,
    unauthorized,
    upstream_busy,
    upstream_malformed,
    upstream_stream_broken,
    upstream_timeout,
    upstream_unavailable,
)

log = logging.getLogger(__name__)

# Headers that describe one hop, or that the client sets itself, are not copied across.
HOP_HEADERS = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                         "transfer-encoding", "upgrade", "host", "content-length", "accept-encoding"})
# Request headers that concern the client and the proxy alone, never the provider: the client's cookies (the review
# console's session among them, where `serve` mounts the console) and what a reverse proxy in front of us says about
# the client's own connection (its address, the host and scheme it asked for).
_CLIENT_ONLY = frozenset({"cookie", "forwarded", "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto",
                          "x-forwarded-port", "x-real-ip"})
# Headers our own server writes on every response: the provider's would make two of each.
_WRITTEN_BY_US = frozenset({"date", "server"})
# A provider's cookies belong to its own domain: passed on, they would be set on the proxy's origin, where `serve` may
# mount the review console and its session cookie.
_PROVIDERS_OWN = frozenset({"set-cookie", "set-cookie2"})
# What else a response loses, by what becomes of its body on the way to our client.
_DROPPED_WITH_BODY = {"as_sent": frozenset(), "decoded": frozenset({"content-encoding"}),
                      "ours": frozenset({"content-encoding", "content-type"})}
_COME_BACK_LATER = (429, 503)
_MAX_RETRY_AFTER_S = 5.0
_MAX_BACKOFF_S = 4.0
_SEGMENT_SAFE = "-._~:@!$&'()*+,;="
_LINE_BREAK = re.compile(rb"\r\n|\r|\n")
_MAX_ERROR_BODY = 16 * 1024 * 1024
# What we ask the provider to compress with: codings that an error body can be masked under (aiohttp would
# also offer br and zstd where their libraries are installed).
_ACCEPT_ENCODING = "gzip, deflate"


def response_headers(headers: Mapping[str, str], *, body: Literal["as_sent", "decoded", "ours"]) -> dict[str, str]:
    """The provider's response headers worth keeping (rate limits, request ids, Retry-After; never its cookies) for a
    body passed on as sent, decoded (no longer compressed), or written by us (re-serialised JSON, our own SSE)."""
    drop = HOP_HEADERS | _WRITTEN_BY_US | _PROVIDERS_OWN | _DROPPED_WITH_BODY[body]
    kept: dict[str, str] = {}
    for name, value in headers.items():
        key = name.lower()
        if key not in drop:
            kept[key] = f"{kept[key]}, {value}" if key in kept else value
    return kept


def _wire_value(value: str) -> str:
    """A header value that aiohttp writes as the bytes the client sent.

    The server decoded those bytes as latin-1 and aiohttp encodes as UTF-8: bytes that are UTF-8 text
    travel unchanged; other bytes (obs-text, which no provider interprets) travel as the same characters.
    """
    value = value.strip(" \t")  # RFC 9110 5.5; h11 strips it, httptools keeps it
    if value.isascii():
        return value
    try:
        return value.encode("latin-1").decode("utf-8")
    except UnicodeError:
        return value


@contextmanager
def _reading(broken: Callable[[str], ProxyError], detail: str) -> Iterator[None]:
    """A stall while reading the body is a 504; a connection that breaks is the 502 `broken(detail)`."""
    try:
        yield
    except TimeoutError:
        raise upstream_timeout() from None
    except aiohttp.ClientError as exc:
        raise broken(f"{detail} ({type(exc).__name__})") from None


class UpstreamResponse:
    """The provider's answer with its body unread: read it whole, as text lines, or as the bytes sent.

    An error's body (status 400 and up) is read with every secret masked (`masking.mask_secrets`): the keys
    configured and `sent`, the credentials this request carried upstream, which a provider may echo."""

    def __init__(self, response: aiohttp.ClientResponse, max_line_bytes: int, sent: tuple[str, ...] = (),
                 our_key: bool = False) -> None:
        self._response = response
        self._max_line = max_line_bytes
        self._sent = sent
        self._our_key = our_key
        self.status_code = response.status
        self.headers: Mapping[str, str] = response.headers

    async def read(self) -> bytes:
        with _reading(upstream_unavailable, "the response body broke off"):
            data = await self._response.read()
        if self.status_code < 400:
            return data
        data = mask_secrets_in(data, *self._sent)
        if self._our_key and self.status_code in (401, 403):  # the proxy's own upstream key: the operator's problem
            log.warning("the provider refused the proxy's upstream key: HTTP %d %s", self.status_code,
                        data[:500].decode("utf-8", "replace"))
        return data

    async def raw(self) -> AsyncIterator[bytes]:
        """The body as sent (compressed as it was); an error's body whole, masked and compressed again."""
        if self.status_code >= 400:
            with _reading(upstream_unavailable, "the response body broke off"):
                data = await self._response.read()
            yield _masked_as_sent(data, self.headers.get("content-encoding", ""), self._sent)
            return
        with _reading(upstream_unavailable, "the response body broke off"):
            async for chunk in self._response.content.iter_any():
                yield chunk

    async def lines(self) -> AsyncIterator[str]:
        """The body as UTF-8 text lines without their line breaks (SSE allows CRLF, LF and CR). A line longer than
        `max_line_bytes` is a 502 as soon as that many bytes of it have arrived: it is never held whole."""
        limit = self._max_line
        # The unfinished line, in pieces: joined only once a line break arrives, so that a long line dripped in small
        # chunks costs its length, not the square of it (this runs on the event loop). Split as bytes: CR and LF
        # never occur inside a UTF-8 sequence, so each line is decoded whole.
        pending: list[bytes] = []
        size = 0
        with _reading(upstream_stream_broken, "the connection broke off"):
            async for chunk in self._response.content.iter_any():
                if b"\n" not in chunk and b"\r" not in chunk and not (pending and pending[-1].endswith(b"\r")):
                    size += len(chunk)
                    if size > limit:
                        raise _too_long(limit)
                    pending.append(chunk)
                    continue
                data = b"".join(pending) + chunk
                keep = 1 if data.endswith(b"\r") else 0  # a CR may be the first half of a CRLF
                *complete, rest = _LINE_BREAK.split(data[:len(data) - keep])
                for line in complete:
                    if len(line) > limit:
                        raise _too_long(limit)
                    yield line.decode("utf-8", "replace")
                rest += data[len(data) - keep:]
                if len(rest) > limit + keep:
                    raise _too_long(limit)
                pending, size = [rest], len(rest)
        last = b"".join(pending)
        if last:
            yield last.decode("utf-8", "replace").removesuffix("\r")


def _masked_as_sent(data: bytes, encoding: str, sent: tuple[str, ...]) -> bytes:
    """An error body as sent, with secrets masked under its content coding (gzip and deflate: the only ones we
    ask for). One we cannot decode (a coding we did not ask for, or more than _MAX_ERROR_BODY) is passed as sent."""
    coding = encoding.strip().lower()
    if coding in ("", "identity"):
        return mask_secrets_in(data, *sent)
    if coding not in ("gzip", "x-gzip", "deflate"):
        return data
    try:
        decoder = zlib.decompressobj(zlib.MAX_WBITS | 32)  # gzip or zlib, by its header
        plain = decoder.decompress(data, _MAX_ERROR_BODY)
        if decoder.unconsumed_tail:
            return data
    except zlib.error:
        return data
    masked = mask_secrets_in(plain, *sent)
    if masked is plain:
        return data
    return gzip.compress(masked) if coding != "deflate" else zlib.compress(masked)


def _too_long(limit: int) -> ProxyError:
    return upstream_malformed(f"a line of the stream is longer than {limit} bytes")


class Upstream:
    def __init__(self, settings: ProxySettings) -> None:
        self.settings = settings.upstream
        self._proxy_keys = [k.get_secret_value().encode() for k in settings.keys]
        add_secrets(config_secrets(settings))
        self.base = URL(self.settings.base_url.rstrip("/") + "/", encoded=True)
        self._base_path = self.base.raw_path
        self._session: aiohttp.ClientSession | None = None
        # The connections requests may hold, waited for here (bounded) rather than in aiohttp's pool (unbounded)
        self._slots = asyncio.Semaphore(self.settings.max_connections)

    def _client(self) -> aiohttp.ClientSession:
        """The pooled session, made on first use (it belongs to the running event loop)."""
        if self._session is None:
            settings = self.settings
            self._session = aiohttp.ClientSession(
                # one connection more than requests may hold: the readiness probe's, never waiting behind them
                connector=aiohttp.TCPConnector(limit=settings.max_connections + 1, limit_per_host=0),
                # sock_read: until the response begins; then `timeout_s` of silence (`_silence`)
                timeout=aiohttp.ClientTimeout(total=settings.response_s, sock_connect=10.0,
                                              sock_read=settings.first_byte_s or settings.timeout_s),
                cookie_jar=aiohttp.DummyCookieJar(), trust_env=False)
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()

    def url_for(self, path: str) -> URL:
        """The upstream URL of a canonical relative path such as `chat/completions`."""
        segments = [s for s in path.split("/") if s]
        if any(s in (".", "..") for s in segments):
            raise ValueError(f"not a canonical path: {path!r}")
        url = URL(str(self.base) + "/".join(quote(s, safe=_SEGMENT_SAFE) for s in segments), encoded=True)
        if (url.scheme, url.host, url.port) != (self.base.scheme, self.base.host, self.base.port) \
                or not url.raw_path.startswith(self._base_path) or url.raw_query_string or url.raw_fragment:
            raise ValueError(f"{path!r} leaves the upstream base")
        return url

    def headers_for(self, incoming: Mapping[str, str]) -> dict[str, str]:
        """The headers to send upstream (never cookies, hop-by-hop headers or our own); checks the client's proxy key
        when we inject our own upstream key. The key the client presented is masked from here on, like a configured
        secret."""
        present_keys(incoming)
        headers = {k: v for k, v in incoming.items() if k.lower() not in HOP_HEADERS
                   and k.lower() not in _CLIENT_ONLY and not k.lower().startswith("x-morphguard-")}
        if self.settings.api_key is None:
            return headers  # the client's own Authorization goes through
        presented = (presented_key({k.lower(): v for k, v in incoming.items()}) or "").encode("latin-1")
        if not any(hmac.compare_digest(presented, key) for key in self._proxy_keys):
            raise unauthorized()
        headers = {k: v for k, v in headers.items() if k.lower() not in ("authorization", "api-key", "x-api-key")}
        headers["authorization"] = f"Bearer {self.settings.api_key.get_secret_value()}"
        return headers

    @asynccontextmanager
    async def open(self, method: str, path: str, headers: Mapping[str, str], content: bytes | None,
                   params: list[tuple[str, str]] | None = None,
                   decoded: bool = True) -> AsyncIterator[UpstreamResponse]:
        """Send and yield the response with its body unread (`decoded`: gzip undone, else the bytes as sent).
        5xx other than a final 503 becomes a 502."""
        sent = {k: _wire_value(v) for k, v in headers.items()}
        sent.setdefault("accept-encoding", _ACCEPT_ENCODING)
        if telemetry.tracing():  # a provider that traces continues our trace (else the client's traceparent went)
            sent.update(telemetry.carrier())
        await self._take_slot()
        try:
            response = await self._send(method, self.url_for(path), sent, content, params, decoded)
            try:
                if response.status >= 500:
                    raise upstream_unavailable(f"HTTP {response.status}",
                                               response_headers(response.headers, body="ours"))
                self._silence(response)
                yield UpstreamResponse(response, self.settings.max_line_bytes, credentials_in(sent),
                                       our_key=self.settings.api_key is not None)
            finally:
                response.release()  # back to the pool when the body was read in full, else the connection is closed
        finally:
            self._slots.release()

    async def _take_slot(self) -> None:
        """A connection of the `max_connections`, waited for at most `pool_wait_s` (then 503)."""
        if not self._slots.locked():
            await self._slots.acquire()  # free: taken without a timer
            return
        try:
            async with asyncio.timeout(self.settings.pool_wait_s):
                await self._slots.acquire()
        except TimeoutError:
            log.warning("all %d upstream connections busy for %g s: request refused", self.settings.max_connections,
                        self.settings.pool_wait_s)
            raise upstream_busy(self.settings.pool_wait_s) from None

    def _silence(self, response: aiohttp.ClientResponse) -> None:
        """From the response's first byte on, the socket may fall silent `timeout_s` at most (until then:
        `first_byte_s`)."""
        connection = response.connection
        if connection is not None and connection.protocol is not None:
            connection.protocol.read_timeout = self.settings.timeout_s

    async def reachable(self) -> bool:
        """Whether the provider answers at all (its model list, within 3 s)."""
        try:
            async with self._client().get(self.url_for("models"), timeout=aiohttp.ClientTimeout(total=3.0),
                                          allow_redirects=False) as response:
                return response.status < 500
        except (aiohttp.ClientError, TimeoutError):
            return False

    def _retryable(self, exc: BaseException) -> bool:
        if isinstance(exc, (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)):
            return True
        return self.settings.retry_reads and isinstance(exc, (aiohttp.SocketTimeoutError, aiohttp.ClientOSError,
                                                              aiohttp.ServerDisconnectedError))

    @staticmethod
    def _backoff(attempt: int, retry_after: str | None) -> float:
        """Seconds before the next attempt: a short Retry-After as given, else full-jitter exponential backoff."""
        if retry_after:
            try:
                return min(_MAX_RETRY_AFTER_S, max(0.0, float(retry_after)))
            except ValueError:
                pass  # an HTTP date: fall back to our own backoff
        return random.uniform(0.0, min(_MAX_BACKOFF_S, 0.2 * 2 ** (attempt - 1)))

    async def _send(self, method: str, url: URL, headers: dict[str, str], content: bytes | None,
                    params: list[tuple[str, str]] | None, decoded: bool) -> aiohttp.ClientResponse:
        # A plain loop rather than tenacity: this runs once per proxied request, and tenacity's per-call
        # set-up was ~5 % of the proxy's CPU time per request in the profile.
        attempts = self.settings.max_attempts
        client = self._client()
        for attempt in range(1, attempts + 1):
            last = attempt == attempts
            try:
                response = await client.request(method, url, headers=headers, data=content, params=params,
                                                allow_redirects=False, auto_decompress=decoded)
            except TimeoutError as exc:
                if last or not self._retryable(exc):
                    raise upstream_timeout() from None
            except aiohttp.ClientError as exc:
                if last or not self._retryable(exc):
                    raise upstream_unavailable(type(exc).__name__) from None
            else:
                if response.status not in _COME_BACK_LATER or last:
                    return response
                response.release()
                log.warning("upstream answered %d (attempt %d/%d)", response.status, attempt, attempts)
                await asyncio.sleep(self._backoff(attempt, response.headers.get("retry-after")))
                continue
            await asyncio.sleep(self._backoff(attempt, None))
        raise AssertionError("unreachable")  # pragma: no cover
