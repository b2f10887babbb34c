"""Every error the proxy answers with, as OpenAI-shaped JSON: {"error": {message, type, param, code}}.

No stack trace and no secret ever reaches a client: unexpected exceptions become a generic 500 here,
and their details go to the log only. `code` is short and stable; it is also the `reason` the audit
trail records for a request that ended in that error.

A provider's error may echo the key it was sent ("Incorrect API key provided: sk-upst*****cret"), and
litellm's exceptions carry the provider's message: every `ProxyError` message (so what the client gets, the log
and the span's exception event) has every secret of the config and the current request's key masked
(`morphguard.masking.mask_secrets`). `ProxyError` itself, and `store_unavailable`, live in `morphguard.errors`:
the settle side (`morphguard.settle`), below this edge, raises them too.

    ProxyError (status, message, type, param, code)
    ├── 400 invalid_request      bad_request: the client's body, path or headers
    ├── 401 invalid_api_key      unauthorized, metrics_unauthorized (GET /metrics without its token)
    ├── 403 unchecked_route      a generation route the guard cannot check
    ├── 404 not_found            a path the proxy does not serve or pass through
    ├── 413 request_too_large
    ├── 499 client_disconnected  the client left before its request body was complete, or its answer was ready
    ├── 502 upstream_unavailable / upstream_malformed / upstream_stream_broken
    ├── 503 store_unavailable     the audit trail cannot be written: no answer goes out without its row
    │       upstream_busy         every connection to the upstream busy for `upstream.pool_wait_s`
    └── 504 upstream_timeout
"""

from __future__ import annotations

import json
import logging
from typing import Any

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from morphguard.errors import ProxyError
from morphguard.errors import store_unavailable as store_unavailable

log = logging.getLogger(__name__)


def json_bytes(content: Any) -> bytes:
    """Compact JSON as UTF-8; every body the proxy writes goes through here.

    orjson writes it (several times faster than the standard library; this runs on every response). What
    orjson refuses goes to the standard library: a lone surrogate, which JSON escapes can carry but UTF-8
    cannot, is then written as an ASCII escape, and an integer beyond 64 bits stays exact.
    """
    try:
        return orjson.dumps(content)
    except orjson.JSONEncodeError:
        pass
    text = json.dumps(content, ensure_ascii=False, separators=(",", ":"))
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(content, separators=(",", ":")).encode("ascii")


class JSON(Response):
    """Starlette's JSONResponse, minus its failure on lone surrogates."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return json_bytes(content)


def bad_request(message: str, param: str | None = None) -> ProxyError:
    return ProxyError(400, message, "invalid_request_error", param, "invalid_request")


def unauthorized() -> ProxyError:
    return ProxyError(401, "A valid proxy API key is required (Authorization: Bearer <key>).",
                      "authentication_error", None, "invalid_api_key")


def metrics_unauthorized() -> ProxyError:
    return ProxyError(401, "GET /metrics needs the metrics token (Authorization: Bearer <token>).",
                      "authentication_error", None, "invalid_api_key", {"www-authenticate": "Bearer"})


def not_found(path: str) -> ProxyError:
    return ProxyError(404, f"morphguard does not serve or pass through '{path[:200]}' (see proxy.passthrough).",
                      "invalid_request_error", None, "not_found")


def unchecked_route(route: str) -> ProxyError:
    return ProxyError(403, f"'{route}' generates text that morphguard cannot check, so it is refused. Use "
                      "/v1/chat/completions, or list the route in proxy.unchecked_routes to let it pass "
                      "unchecked (audited).", "permission_error", None, "unchecked_route")


def too_large(limit: int) -> ProxyError:
    return ProxyError(413, f"The request body is larger than {limit} bytes.", "invalid_request_error", None,
                      "request_too_large")


def client_disconnected() -> ProxyError:
    """The client closed the connection mid-upload: nobody reads this answer, and no server error is counted."""
    return ProxyError(499, "The client closed the connection before its request body was complete.",
                      "invalid_request_error", None, "client_disconnected")


def client_left() -> ProxyError:
    """The client closed the connection while its answer was being made: the work on it stops."""
    return ProxyError(499, "The client closed the connection before its answer was ready.", "invalid_request_error",
                      None, "client_disconnected")


def upstream_unavailable(detail: str, headers: dict[str, str] | None = None) -> ProxyError:
    return ProxyError(502, f"The upstream provider could not be reached or failed: {detail}", "upstream_error",
                      None, "upstream_unavailable", headers)


def upstream_malformed(detail: str) -> ProxyError:
    return ProxyError(502, f"The upstream provider sent a malformed response: {detail}", "upstream_error", None,
                      "upstream_malformed")


def upstream_stream_broken(detail: str) -> ProxyError:
    return ProxyError(502, f"The upstream stream ended abnormally: {detail}", "upstream_error", None,
                      "upstream_stream_broken")


def upstream_busy(waited_s: float) -> ProxyError:
    return ProxyError(503, f"Every connection to the upstream provider stayed busy for {waited_s:g} s "
                      "(proxy.upstream.max_connections); try again later.", "server_error", None, "upstream_busy",
                      {"retry-after": str(max(1, round(waited_s)))})


def upstream_timeout() -> ProxyError:
    return ProxyError(504, "The upstream provider did not answer in time.", "upstream_error", None,
                      "upstream_timeout")


async def handle_unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    # The connection may be in an unknown state: do not keep it alive.
    return JSON({"error": {"message": "Internal error in morphguard.", "type": "server_error", "param": None,
                           "code": "internal_error"}}, 500, headers={"connection": "close"})


def answer(exc: ProxyError) -> Response:
    """The error as the response its client gets."""
    return JSON(exc.payload(), exc.status, headers=exc.headers)


async def handle_proxy_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ProxyError)
    return answer(exc)


async def handle_http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own 404/405 as OpenAI-shaped errors."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        return answer(not_found(request.url.path))
    code = "method_not_allowed" if exc.status_code == 405 else "http_error"
    return answer(ProxyError(exc.status_code, str(exc.detail), "invalid_request_error", None, code,
                             dict(exc.headers or {})))
