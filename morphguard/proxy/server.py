"""Serving the proxy with uvicorn, in one process or several, whose own answers to unparseable HTTP are
JSON errors too.

uvicorn answers a request it cannot parse (a bad header, a malformed request line) with a plain-text
400 before any app code runs; here that answer is the same OpenAI-shaped error as every other. The
HTTP parser is httptools (C, llhttp) and the event loop uvloop: benchmarks/proxy_overhead.py measures
what each costs.

With `processes` > 1 (`morphguard serve --workers N`) uvicorn binds the port once and N processes accept
on it, each a whole proxy with its own event loop, so throughput scales with cores. What they share is
set up once here, before any of them starts: the audit store's schema (migrated once, then written by
all of them through SQLite's WAL or PostgreSQL) and the embedded judge (one server for all; N would
not fit in memory or cores). The embedded check queue is one process's own; async checks over several
processes need the shared queue (`queue.url`, Redis).
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import uvicorn
from uvicorn.config import LOGGING_CONFIG
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from morphguard.config import Config, load_config
from morphguard.errors import ConfigError
from morphguard.proxy.errors import bad_request, json_bytes

# How each of several processes finds what the first set up: its config file ("" for the built-in
# defaults) and the embedded judge's URL.
CONFIG_ENV = "MORPHGUARD_SERVE_CONFIG"
JUDGE_ENV = "MORPHGUARD_SERVE_JUDGE"


class JSONErrorHttpToolsProtocol(HttpToolsProtocol):
    def send_400_response(self, msg: str) -> None:
        body = json_bytes(bad_request(f"The HTTP request could not be parsed: {msg}").payload())
        self.transport.write(b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
                             b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)
        self.transport.close()


def serve(config: Config, config_path: Path | None, host: str, port: int, *, log_level: str, grace_s: int,
          processes: int = 1) -> None:
    options: dict[str, Any] = {"host": host, "port": port, "log_level": log_level, "log_config": _log_config(),
                               "timeout_graceful_shutdown": grace_s, "http": JSONErrorHttpToolsProtocol}
    if processes == 1:
        from morphguard.proxy.app import create_app

        uvicorn.run(create_app(config), **options)
        return
    os.environ[CONFIG_ENV] = str(config_path or "")
    judge = _share(config)
    if judge:
        os.environ[JUDGE_ENV] = judge
    uvicorn.run(f"{__name__}:app_of_process", factory=True, workers=processes, **options)


def _log_config() -> dict[str, Any]:
    """uvicorn's own logging, its lines dated as morphguard's are."""
    config = copy.deepcopy(LOGGING_CONFIG)
    for formatter in config["formatters"].values():
        formatter["fmt"] = "%(asctime)s " + formatter["fmt"]
    return config


def app_of_process() -> Any:
    """The app of one of several processes (uvicorn calls this in each)."""
    from morphguard.proxy.app import create_app

    config = load_config(os.environ[CONFIG_ENV] or None)
    judge = os.environ.get(JUDGE_ENV)
    if judge:
        config = config.model_copy(update={"local": config.local.model_copy(update={"base_url": judge})})
    return create_app(config)


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
