"""Every error the proxy answers with, as OpenAI-shaped JSON: {"error": {message, type, param, code}}.

No stack trace and no secret ever reaches a client: unexpected exceptions become a generic 500 here,
and their details go to the log only. `code` is short and stable; it is also the `reason` the audit
trail records for a request that ended in that error.

A provider's error may echo the key it was sent ("Incorrect API key provided: sk-upst*****cret"), and
litellm's exceptions carry the provider's message. `mask_secrets` knows every secret of the config and
the key the current request presented, and takes them out, whole or partly echoed: from every
`ProxyError` message (so from what the client gets, the log and the span's exception event), from
upstream error bodies (`upstream.UpstreamResponse`) and, through `install_log_masking`, from every log
record of the process.

    ProxyError (status, message, type, param, code)
    ├── 400 invalid_request      bad_request: the client's body, path or headers
    ├── 401 invalid_api_key      unauthorized, metrics_unauthorized (GET /metrics without its token)
    ├── 403 unchecked_route      a generation route the guard cannot check
    ├── 404 not_found            a path the proxy does not serve or pass through
    ├── 413 request_too_large
    ├── 499 client_disconnected  the client left before its request body was complete
    ├── 502 upstream_unavailable / upstream_malformed / upstream_stream_broken
    └── 504 upstream_timeout
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from typing import Any

import orjson
from pydantic import BaseModel, SecretStr
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from morphguard.proxy.credentials import bearer_token

log = logging.getLogger(__name__)


class ProxyError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        message = mask_secrets(message)
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers or {}

    def payload(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> Response:
        return JSON(self.payload(), self.status, headers=self.headers)


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


def upstream_unavailable(detail: str, headers: dict[str, str] | None = None) -> ProxyError:
    return ProxyError(502, f"The upstream provider could not be reached or failed: {detail}", "upstream_error",
                      None, "upstream_unavailable", headers)


def upstream_malformed(detail: str) -> ProxyError:
    return ProxyError(502, f"The upstream provider sent a malformed response: {detail}", "upstream_error", None,
                      "upstream_malformed")


def upstream_stream_broken(detail: str) -> ProxyError:
    return ProxyError(502, f"The upstream stream ended abnormally: {detail}", "upstream_error", None,
                      "upstream_stream_broken")


def upstream_timeout() -> ProxyError:
    return ProxyError(504, "The upstream provider did not answer in time.", "upstream_error", None,
                      "upstream_timeout")


async def handle_unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    # The connection may be in an unknown state: do not keep it alive.
    return JSON({"error": {"message": "Internal error in morphguard.", "type": "server_error", "param": None,
                           "code": "internal_error"}}, 500, headers={"connection": "close"})


async def handle_proxy_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ProxyError)
    return exc.response()


async def handle_http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own 404/405 as OpenAI-shaped errors."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        return not_found(request.url.path).response()
    code = "method_not_allowed" if exc.status_code == 405 else "http_error"
    return ProxyError(exc.status_code, str(exc.detail), "invalid_request_error", None, code,
                      dict(exc.headers or {})).response()


# --- secrets ------------------------------------------------------------------------------------------------------

MASK = "[masked]"
# Shorter secrets are not masked: they cannot be told from ordinary words (and are no real provider's keys).
MIN_SECRET_LENGTH = 8
_secrets: set[str] = set()
_presented: ContextVar[tuple[str, ...]] = ContextVar("morphguard_presented_keys", default=())
# A partly echoed key: a visible start and/or end around a run of mask characters ("sk-upst*****cret",
# "sk-...cret"). Masked when the visible parts are the start and the end of a secret.
_PARTIAL = re.compile(r"(?<![\w-])([\w-]*)(?:\*{3,}|•{3,}|\.{3,}|…)([\w-]*)")
_PARTIAL_HINTS = ("***", "•••", "...", "…")
# A text that ends in the first six or more characters of a secret (fewer give nothing away).
_CUT = re.compile(r"(?<![\w-])[\w-]{6,}$")
_NOT_SECRET = (int, float, bool, type(None))


def add_secrets(values: Iterable[str | SecretStr | None]) -> None:
    """Make these secrets masked wherever the proxy answers or logs (see `config_secrets`)."""
    for value in values:
        text = value.get_secret_value() if isinstance(value, SecretStr) else value
        if text is not None and len(text.strip()) >= MIN_SECRET_LENGTH:
            _secrets.add(text.strip())


def config_secrets(config: BaseModel) -> list[str]:
    """Every SecretStr of a config, however deep: upstream and anthropic keys, proxy keys, litellm route keys,
    the judge's key, route rules' client keys, telemetry headers."""
    found: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, SecretStr):
            found.append(value.get_secret_value())
        elif isinstance(value, BaseModel):
            for _, item in value:
                walk(item)
            for item in (value.model_extra or {}).values():
                walk(item)
        elif isinstance(value, Mapping):
            for item in value.values():
                walk(item)
        elif isinstance(value, (list, tuple, set, frozenset)):
            for item in value:
                walk(item)

    walk(config)
    return found


def credentials_in(headers: Mapping[str, str]) -> tuple[str, ...]:
    """The keys in request headers: bearer token (and the whole Authorization value), x-api-key, api-key."""
    keys: list[str] = []
    for name in ("authorization", "x-api-key", "api-key"):
        value = headers.get(name, "").strip()
        if value:
            keys.append(value)
            token = bearer_token(value) if name == "authorization" else None
            if token:
                keys.append(token)
    return tuple(k for k in keys if len(k) >= MIN_SECRET_LENGTH)


def present_keys(headers: Mapping[str, str]) -> None:
    """Remember the keys a request presents for the rest of its handling (a context variable: its task and what
    that starts), so that they are masked like configured secrets."""
    presented = credentials_in(headers)
    if presented != _presented.get():
        _presented.set(presented)


def mask_secrets(text: str, *also: str) -> str:
    """`text` with every secret the proxy knows (configured ones, the current request's key, `also`) replaced by
    "[masked]", whether it appears whole or partly echoed ("sk-upst*****cret")."""
    keys = [*_secrets, *_presented.get(), *(k for k in also if len(k) >= MIN_SECRET_LENGTH)]
    if not keys:
        return text
    for key in sorted(keys, key=len, reverse=True):
        if key in text:
            text = text.replace(key, MASK)
    if any(hint in text for hint in _PARTIAL_HINTS):
        text = _PARTIAL.sub(lambda m: MASK if _echoes(m.group(1), m.group(2), keys) else m.group(0), text)
    tail = len(text) - max(map(len, keys)) - 1
    cut = _CUT.search(text, max(tail, 0))  # a message cut short in the middle of a key ("... provided: sk-upstre")
    if cut and any(k.startswith(cut.group()) for k in keys):
        text = text[:cut.start()] + MASK
    return text


def _echoes(head: str, tail: str, keys: list[str]) -> bool:
    return len(head) + len(tail) >= 2 and any(k.startswith(head) and k.endswith(tail) for k in keys)


def mask_secrets_in(data: bytes, *also: str) -> bytes:
    """`mask_secrets` over a body: UTF-8 (other bytes kept as they are), unchanged when there is nothing to mask."""
    text = data.decode("utf-8", "surrogateescape")
    masked = mask_secrets(text, *also)
    return data if masked == text else masked.encode("utf-8", "surrogateescape")


class SecretMaskingFilter(logging.Filter):
    """Masks secrets in a record's message, arguments and traceback (formatted here, so that the handler prints
    the masked one)."""

    _formatter = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        if not _secrets and not _presented.get():
            return True
        record.msg = _masked_arg(record.msg)
        if isinstance(record.args, Mapping):
            record.args = {k: _masked_arg(v) for k, v in record.args.items()}
        elif record.args:
            record.args = tuple(_masked_arg(a) for a in record.args)
        if record.exc_info and not record.exc_text:
            record.exc_text = mask_secrets(self._formatter.formatException(record.exc_info))
        if record.stack_info:
            record.stack_info = mask_secrets(record.stack_info)
        return True


def _masked_arg(value: Any) -> Any:
    """The argument as it was, or its masked text when that differs (so %d and %r keep working where no secret is)."""
    if isinstance(value, _NOT_SECRET):
        return value
    text = value if isinstance(value, str) else str(value)
    masked = mask_secrets(text)
    return value if masked == text else masked


_masking = SecretMaskingFilter()


def mask_config_secrets(config: BaseModel) -> None:
    """Mask every secret of `config` in this process: in error messages, upstream error bodies and log records.
    Each serving process calls it (`server`); any other process that logs with the config's secrets should too."""
    add_secrets(config_secrets(config))
    install_log_masking()


def install_log_masking() -> None:
    """Pass every log record of the process through `SecretMaskingFilter` as it is made: whichever logger made it
    and whichever handlers print it (uvicorn's, ours, litellm's own, added later, an OTel log exporter)."""
    previous = logging.getLogRecordFactory()
    if getattr(previous, "masks_secrets", False):
        return

    def masked_record(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        _masking.filter(record)
        return record

    masked_record.masks_secrets = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(masked_record)
