"""Serving the proxy with uvicorn, whose own answers to unparseable HTTP are JSON errors too.

uvicorn answers a request it cannot parse (a bad header, a malformed request line) with a plain-text
400 before any app code runs; here that answer is the same OpenAI-shaped error as every other. The
HTTP parser is httptools (C, llhttp) when installed, else h11 (pure Python), and the event loop uvloop
when installed: benchmarks/proxy_overhead.py measures what each costs.
"""

from __future__ import annotations

from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from morphguard.proxy.errors import bad_request, json_bytes


class JSONErrorH11Protocol(H11Protocol):
    def send_400_response(self, msg: str) -> None:
        body = _error_400(msg)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close")]
        for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"), h11.Data(data=body),
                      h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.transport.close()


def _error_400(msg: str) -> bytes:
    return json_bytes(bad_request(f"The HTTP request could not be parsed: {msg}").payload())


def protocol() -> type:
    """The HTTP protocol class: httptools' when it is installed (C, several times faster), else h11's."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return JSONErrorH11Protocol

    class JSONErrorHttpToolsProtocol(HttpToolsProtocol):
        def send_400_response(self, msg: str) -> None:
            body = _error_400(msg)
            self.transport.write(b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
                                 b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n"
                                 + body)
            self.transport.close()

    return JSONErrorHttpToolsProtocol


def serve(app: Any, host: str, port: int, *, log_level: str, grace_s: int) -> None:
    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=grace_s,
                http=protocol())
