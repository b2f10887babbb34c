"""`morphguard worker`: a process that runs async checks from the shared queue and nothing else.

It builds the same guard as the proxy (detector, policy, audit store, escalation outbox, verdict cache),
so a check run here ends exactly as one run in a proxy would: an audit row, maybe an escalation. Run as
many as the judge can serve, on any machine that reaches the queue, the store and the judge.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from morphguard.config import Config
from morphguard.detectors import build_detector
from morphguard.detectors.judges import require_judges
from morphguard.errors import MorphguardError
from morphguard.policy.engine import PolicyEngine
from morphguard.proxy.errors import mask_config_secrets
from morphguard.proxy.guard import build_guard
from morphguard.telemetry import setup as telemetry_setup

log = logging.getLogger(__name__)


async def run(config: Config, concurrency: int, ready: asyncio.Event | None = None) -> None:
    """Consume until SIGTERM or SIGINT; checks under way finish within `proxy.shutdown_grace_s`."""
    if config.queue.url is None:
        raise MorphguardError("morphguard worker consumes a shared queue: set queue.url (redis://...)")
    # A worker checks in its own process whatever the replicas' `inline_via` says: it is the pool.
    config = config.model_copy(update={"proxy": config.proxy.model_copy(update={"workers": concurrency,
                                                                                 "inline_via": "process"})})
    mask_config_secrets(config)  # judge errors can echo its key into the log
    telemetry_setup.configure(config.telemetry)
    detector = await asyncio.to_thread(build_detector, config)  # may start the embedded judge
    await require_judges(config, getattr(detector, "llm", None))
    guard = await asyncio.to_thread(build_guard, config, detector, PolicyEngine(config.policy))
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await guard.start()
    log.warning("worker %s: %d checks at once from %s", getattr(guard.queue, "consumer", "?"), concurrency,
                config.queue.stream)
    if ready is not None:
        ready.set()
    try:
        await stopping.wait()
    finally:
        await guard.stop()
        await guard.close()
        telemetry_setup.shutdown()
