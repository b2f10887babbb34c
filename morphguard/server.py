"""Serving the proxy with uvicorn, in one process or several, whose own answers to unparseable HTTP are
JSON errors too, and which closes connections whose request head does not arrive in time.

The app served is the proxy's with the gateways' webhook guardrails of `integrations` (`served_app`): composed here,
above both, so the proxy imports no integration and the integrations import the proxy.

uvicorn answers a request it cannot parse (a bad header, a malformed request line) with a plain-text
400 before any app code runs; here that answer is the same OpenAI-shaped error as every other. The
HTTP parser is httptools (C, llhttp) and the event loop uvloop: benchmarks/proxy_overhead.py measures
what each costs; the only protocol class served is `HttpProtocol` (h11 is never selected).

uvicorn bounds how long a connection may sit idle between requests (its keep-alive timeout), but not how
long a request head may take to arrive: a client that sends a header line now and then holds its
connection, and a slot of the server, forever. `HttpProtocol` closes a connection whose request head is
not complete `proxy.header_timeout_s` after the connection opened or, on a kept-alive connection, after
the head's first byte (a 408 first when a request was begun).

Every secret of the config, and the key each request presents, is masked in every log record of every
process (`masking.mask_config_secrets`).

With `processes` > 1 (`morphguard serve --workers N`) uvicorn binds the port once and N processes accept
on it, each a whole proxy with its own event loop, so throughput scales with cores. What they share is
set up once here, before any of them starts: the audit store's schema (migrated once, then written by
all of them through SQLite's WAL or PostgreSQL) and the embedded judge (one server for all; N would
not fit in memory or cores). The embedded check queue is one process's own; async checks over several
processes need the shared queue (`queue.url`, Redis).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import uvicorn
from uvicorn.config import LOGGING_CONFIG
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from morphguard.config import Config, load_config
from morphguard.errors import ConfigError
from morphguard.masking import mask_config_secrets
from morphguard.proxy.errors import ProxyError, bad_request, json_bytes

log = logging.getLogger(__name__)

# How each of several processes finds what the first set up: its config file ("" for the built-in
# defaults) and the embedded judge's URL.
CONFIG_ENV = "MORPHGUARD_SERVE_CONFIG"
JUDGE_ENV = "MORPHGUARD_SERVE_JUDGE"


class HttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with JSON 400s and a deadline for each request head."""

    header_timeout_s = 10.0  # set from proxy.header_timeout_s in each serving process (`_prepare`)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_begun = False
        super().connection_made(transport)
        self._await_head()  # a connection that sends nothing at all is closed too

    def data_received(self, data: bytes) -> None:
        if self._head_timer is None and (self.cycle is None or self.cycle.response_complete):
            self._await_head()  # the first bytes of the next request: its head is due in time
        self._head_begun = True
        super().data_received(data)

    def on_headers_complete(self) -> None:
        self._head_done()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_done()
        super().connection_lost(exc)

    def _await_head(self) -> None:
        self._head_begun = False
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _head_done(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or (self.cycle is not None and not self.cycle.response_complete):
            return
        client = f"{self.client[0]}:{self.client[1]} " if self.client else ""
        log.info("%sclosed: no complete request head within %g s", client, self.header_timeout_s)
        if self._head_begun:  # a request was begun: tell it why it ends
            error = ProxyError(408, f"The request head was not complete within {self.header_timeout_s:g} s.",
                               "invalid_request_error", None, "request_timeout")
            self._write_error(408, b"Request Timeout", json_bytes(error.payload()))
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        self._write_error(400, b"Bad Request",
                          json_bytes(bad_request(f"The HTTP request could not be parsed: {msg}").payload()))
        self.transport.close()

    def _write_error(self, status: int, reason: bytes, body: bytes) -> None:
        self.transport.write(b"HTTP/1.1 " + str(status).encode() + b" " + reason + b"\r\n"
                             b"content-type: application/json\r\ncontent-length: " + str(len(body)).encode()
                             + b"\r\nconnection: close\r\n\r\n" + body)


def _prepare(config: Config) -> None:
    """What every serving process sets up before it takes a connection: the head deadline, the secrets masked."""
    HttpProtocol.header_timeout_s = config.proxy.header_timeout_s
    mask_config_secrets(config)


def serve(config: Config, config_path: Path | None, host: str, port: int, *, log_level: str, grace_s: int,
          processes: int = 1) -> None:
    # uvicorn builds every response's access line (client address, quoted path) before its logger drops it: only
    # where the level shows it
    options: dict[str, Any] = {"host": host, "port": port, "log_level": log_level, "log_config": _log_config(),
                               "access_log": log_level in ("trace", "debug", "info"),
                               "timeout_graceful_shutdown": grace_s, "http": HttpProtocol}
    _prepare(config)
    _started.info("%s", startup_line(config, config_path, host, port, processes))
    if processes == 1:
        uvicorn.run(served_app(config), **options)
        return
    os.environ[CONFIG_ENV] = str(config_path or "")
    judge = _share(config)
    if judge:
        os.environ[JUDGE_ENV] = judge
    uvicorn.run(f"{__name__}:app_of_process", factory=True, workers=processes, **options)


# The one start-up line has a logger of its own, shown at INFO whatever level the rest logs at: what a proxy
# serves, from which config, is what an operator looks for first.
_started = logging.getLogger("morphguard.serve")
_started.setLevel(logging.INFO)


def startup_line(config: Config, config_path: Path | None, host: str, port: int, processes: int) -> str:
    """Where the proxy listens, which config it read, its profiles, judge and stores; URLs without credentials."""
    from morphguard.detectors import resolve  # the check `detector.name: auto` comes to with this judge

    shown_host = f"[{host}]" if ":" in host else host
    judge = config.judge.model
    if judge == "local":
        judge = f"embedded {config.local.filename}"
        if config.local.base_url:  # a llama.cpp server already running, not started here
            judge += f" at {without_credentials(config.local.base_url)}"
    elif config.judge.api_base:
        judge += f" at {without_credentials(config.judge.api_base)}"
    audit = (without_credentials(config.store.url) if config.store.url else f"sqlite {config.policy.audit.path}") \
        if config.policy.audit.enabled else "off"
    queue = without_credentials(config.queue.url) if config.queue.url else "embedded sqlite"
    parts = [f"morphguard proxy on http://{shown_host}:{port}/v1",
             f"config {config_path if config_path else '(defaults)'}",
             f"profiles {', '.join(config.policy.profiles)}",
             f"check {resolve(config)[0].name} with judge {judge}",
             f"upstream {without_credentials(config.proxy.upstream.base_url)}",
             f"audit {audit}", f"queue {queue}", f"mode {config.proxy.mode}"]
    if processes > 1:
        parts.append(f"{processes} processes")
    return "; ".join(parts)


def without_credentials(url: str) -> str:
    """A URL with any user name and password taken out (database and Redis URLs carry them)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]))


def _log_config() -> dict[str, Any]:
    """uvicorn's own logging, its lines dated as morphguard's are."""
    config = copy.deepcopy(LOGGING_CONFIG)
    for formatter in config["formatters"].values():
        formatter["fmt"] = "%(asctime)s " + formatter["fmt"]
    return config


def app_of_process() -> Any:
    """The app of one of several processes (uvicorn calls this in each)."""
    config = load_config(os.environ[CONFIG_ENV] or None)
    judge = os.environ.get(JUDGE_ENV)
    if judge:
        config = config.model_copy(update={"local": config.local.model_copy(update={"base_url": judge})})
    _prepare(config)
    return served_app(config)


def served_app(config: Config) -> Any:
    """The app `morphguard serve` runs: the proxy's routes, with the gateways' webhooks."""
    from morphguard.integrations import portkey
    from morphguard.proxy.app import create_app

    return create_app(config, webhooks={"portkey": portkey.webhook})


def _share(config: Config) -> str | None:
    """Check that `config` can run as several processes and set up what they share; the judge's URL."""
    from morphguard.detectors import resolve
    from morphguard.llm import uses_embedded_judge
    from morphguard.llm.local import shared_judge
    from morphguard.policy.audit import AuditStore

    proxy = config.proxy
    if config.queue.url is None and "async" in (proxy.mode, proxy.stream_mode):
        raise ConfigError("async checks in several processes need the shared queue: set queue.url (Redis), "
                          "or serve with one process (the embedded queue belongs to one process)")
    if config.policy.audit.enabled:
        AuditStore(config.policy.audit, config.store).close()  # migrated once, not raced by N processes
    spec, settings = resolve(config)
    models = spec.models(settings)
    if models and uses_embedded_judge(config, models):
        return shared_judge(config.local).start()
    return None
