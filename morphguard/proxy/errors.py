"""Every error the proxy answers with, as OpenAI-shaped JSON: {"error": {message, type, param, code}}.

No stack trace and no secret ever reaches a client: unexpected exceptions become a generic 500 here,
and their details go to the log only.
"""

from __future__ import annotations

import logging

from starlette.requests import Request
from starlette.responses import JSONResponse

log = logging.getLogger(__name__)


class ProxyError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code

    def response(self) -> JSONResponse:
        return error_response(self.status, self.message, self.type, self.param, self.code)


def error_response(status: int, message: str, type_: str = "invalid_request_error",
                   param: str | None = None, code: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type_, "param": param, "code": code}},
                        status_code=status)


def bad_request(message: str, param: str | None = None) -> ProxyError:
    return ProxyError(400, message, "invalid_request_error", param, "invalid_request")


def unauthorized() -> ProxyError:
    return ProxyError(401, "A valid proxy API key is required (Authorization: Bearer <key>).",
                      "authentication_error", None, "invalid_api_key")


def too_large(limit: int) -> ProxyError:
    return ProxyError(413, f"The request body is larger than {limit} bytes.", "invalid_request_error", None,
                      "request_too_large")


def upstream_unavailable(detail: str) -> ProxyError:
    return ProxyError(502, f"The upstream provider could not be reached or failed: {detail}", "upstream_error",
                      None, "upstream_unavailable")


def upstream_timeout() -> ProxyError:
    return ProxyError(504, "The upstream provider did not answer in time.", "upstream_error", None,
                      "upstream_timeout")


async def handle_unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return error_response(500, "Internal error in morphguard.", "server_error", None, "internal_error")


async def handle_proxy_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ProxyError)
    return exc.response()
