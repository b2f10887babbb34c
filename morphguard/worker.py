"""`morphguard worker`: a process that runs async checks from the shared queue and nothing else.

It starts the same guard as the proxy (`settle.guard.start`: detector, policy, audit store, escalation outbox,
verdict cache),
so a check run here ends exactly as one run in a proxy would: an audit row, maybe an escalation. Run as
many as the judge can serve, on any machine that reaches the queue, the store and the judge.

With `queue.worker_port` (`--port`) it also answers /healthz, /readyz and /metrics there, as a replica does
(`proxy/probes.py`), from uvicorn in its own event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Iterator

import uvicorn

from morphguard.config import Config
from morphguard.errors import MorphguardError
from morphguard.masking import mask_config_secrets
from morphguard.proxy.probes import probe_app
from morphguard.server import HttpProtocol
from morphguard.settle.guard import Guard, start

log = logging.getLogger(__name__)


async def run(config: Config, concurrency: int, ready: asyncio.Event | None = None) -> None:
    """Consume until SIGTERM or SIGINT; checks under way finish within `proxy.shutdown_grace_s`."""
    if config.queue.url is None:
        raise MorphguardError("morphguard worker consumes a shared queue: set queue.url (redis://...)")
    # A worker checks in its own process whatever the replicas' `inline_via` says: it is the pool.
    config = config.model_copy(update={"proxy": config.proxy.model_copy(update={"workers": concurrency,
                                                                                 "inline_via": "process"})})
    mask_config_secrets(config)  # judge errors can echo its key into the log
    # Bound first: a port in use ends the worker at once, before a judge starts or a check is taken.
    port = config.queue.worker_port
    listening = _listen(config.queue.worker_host, port) if port is not None else None
    guard = await start(config)  # the detector may start the embedded judge
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    probes = _serve_probes(guard, config, listening) if listening is not None else None
    log.warning("worker %s: %d checks at once from %s", guard.consumer_name, concurrency, config.queue.stream)
    if ready is not None:
        ready.set()
    try:
        await stopping.wait()
    finally:
        await guard.drain()
        if probes is not None:  # answering while checks under way finish
            probes.should_exit = True
            await probes.done
        await guard.stop()


class _ProbeServer(uvicorn.Server):
    """uvicorn without its signal handlers: SIGTERM is the worker's to handle, and it stops this server."""

    done: asyncio.Task[None]

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _listen(host: str, port: int) -> socket.socket:
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        return socket.create_server((host, port), family=family)
    except OSError as exc:
        raise MorphguardError(f"the worker's probes cannot listen on {host}:{port}: {exc.strerror or exc}") from exc


def _serve_probes(guard: Guard, config: Config, listening: socket.socket) -> _ProbeServer:
    """The probes on the bound socket, served from this event loop until `should_exit`."""
    HttpProtocol.header_timeout_s = config.proxy.header_timeout_s
    server = _ProbeServer(uvicorn.Config(probe_app(guard), http=HttpProtocol, lifespan="off", log_config=None,
                                         access_log=False))
    server.done = asyncio.create_task(server.serve(sockets=[listening]))
    host, port = listening.getsockname()[:2]
    log.warning("worker probes on http://%s:%d (/healthz, /readyz, /metrics)", host, port)
    return server
