"""The settle side as the HTTP edge, a worker and the LiteLLM plug-in see it: one object, the `Guard`, built and
started by one function (`start`).

The guard only delegates. Behind it: checking, deciding, carrying out and regenerating (`settle.check`: `Checker`,
`Settler`), the audit trail (`settle.trail`: every accepted request's one row, the escalations, the streams under way),
the queue's front and its consumer (`settle.later`, `settle.consumer`), an answer of several choices settled as a
gateway is told of it (`settle.choices`) and the checks of a stream checked as it flows (`settle.stream_checks`, for
the engine of `settle.incremental`). What crosses the face is the values of `settle.values`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from morphguard import telemetry
from morphguard.config import Config
from morphguard.detectors import Detector, build_detector
from morphguard.detectors.judges import require_judges
from morphguard.policy.audit import AuditStore
from morphguard.policy.engine import PolicyEngine, Reach
from morphguard.policy.record import DecisionRecord
from morphguard.settle import choices
from morphguard.settle.check import Checker, Settler
from morphguard.settle.consumer import Consumer
from morphguard.settle.escalation import Escalator
from morphguard.settle.later import Later
from morphguard.settle.shadow import Shadow
from morphguard.settle.stream_checks import Streaming
from morphguard.settle.trail import Trail
from morphguard.settle.values import Answer, CheckRequest, Reask, Settled, Verdict
from morphguard.store import open_queue
from morphguard.store.detections import DetectionCache
from morphguard.store.redis_queue import RedisCheckQueue
from morphguard.telemetry import setup as telemetry_setup


class Guard:
    """What the edge asks of the settle side, and nothing else of it."""

    def __init__(self, settler: Settler, later: Later) -> None:
        self._checker = settler.checker
        self._settler = settler
        self._trail = settler.trail
        self._later = later
        self._consumer = Consumer(later, settler)
        self._started = False
        telemetry.labels.configure(settler.config)  # the metrics this guard emits carry labels from this config only
        telemetry.prime()

    # --- an answer -------------------------------------------------------------------------------------------

    async def settle(self, request: CheckRequest, answer: Answer, reach: Reach, *,
                     reask: Reask | None = None) -> Settled:
        """Check → policy's one decision → carry it out (`reask`: how to ask the provider again, given where `reach`
        is `ASK_AGAIN`) → audit: the answer in the chat shape as the client gets it, and the record."""
        return await self._settler.settle(request, answer, reach, reask=reask)

    async def check_later(self, request: CheckRequest, answer: Answer) -> DecisionRecord | None:
        """The check queued; the record to send now, or None when the caller must check inline."""
        return await self._later.check_later(request, answer)

    def stream(self, request: CheckRequest) -> Streaming:
        """What a stream needs of the settle side, once: the engine of a stream checked as it flows, its journal
        entry, its row where it ends without a verdict."""
        return Streaming(self._settler, request)

    async def settle_choices(self, first: CheckRequest, answers: list[dict[str, Any]], *, gateway: str | None,
                             max_choices: int, flagged_fails: bool = False) -> Verdict:
        """Each answer (a choice) checked as its own request, and the one verdict a gateway is told of them."""
        return await choices.settle(self._settler, first, answers, gateway=gateway, max_choices=max_choices,
                                    flagged_fails=flagged_fails)

    async def unread(self, request: CheckRequest, reason: str, *, gateway: str | None,
                     flagged_fails: bool = False) -> Verdict:
        """An answer a gateway asked about that cannot be checked, decided as the profile's `on_error` says."""
        return await choices.unread(self._settler, request, reason, gateway=gateway, flagged_fails=flagged_fails)

    # --- the audit trail -------------------------------------------------------------------------------------

    async def account(self, request: CheckRequest, reason: str, answer: str | None = None) -> DecisionRecord:
        """The row of a request that ends without a check (an upstream failure, no context, a full queue)."""
        return await self._trail.account(request, reason, answer)

    # --- what the probes read --------------------------------------------------------------------------------

    @property
    def engine(self) -> PolicyEngine:
        """Policy, which routes a request to its profile and topic before anything is settled."""
        return self._settler.engine

    @property
    def audit(self) -> AuditStore | None:
        """The audit store (the review console reads it); None where the trail is off."""
        return self._trail.audit

    @property
    def judge_base(self) -> str | None:
        """The embedded judge's address, where the check calls one."""
        llm = getattr(self._checker.detector, "llm", None)
        local = getattr(llm, "routes", {}).get("local")
        return local.api_base if local is not None and local.api_base else None

    async def queue_reachable(self) -> bool:
        return await self._later.queue.reachable()

    @property
    def store_writes(self) -> bool:
        """False while the audit store cannot write (from the last write tried: a read does not tell)."""
        return self._trail.store_writes

    @property
    def audit_failures(self) -> int:
        """Rows the database refused, written without their texts."""
        return self._trail.audit_failures

    def escalation_backlog(self) -> dict[str, int]:
        """Escalations waiting for the webhook. Blocking: call it off the loop."""
        return self._trail.escalation_backlog()

    @property
    def consumer_name(self) -> str:
        """The name this process consumes a shared queue under ("?" for a queue of its own)."""
        return str(getattr(self._later.queue, "consumer", "?"))

    # --- its life --------------------------------------------------------------------------------------------

    async def begin(self) -> None:
        """Start the consumer of the check queue (and what runs beside it)."""
        await self._consumer.start()
        self._started = True

    async def drain(self) -> None:
        """Finish what is under way within the grace period; what is left stays queued."""
        if self._started:
            self._started = False
            await self._consumer.stop()

    async def close(self) -> None:
        """Close the stores (after `drain`)."""
        if self._settler.shadow is not None:
            await self._settler.shadow.drain()
        await self._later.queue.close()
        await self._checker.aclose()
        if self._checker.cache is not None:
            await self._checker.cache.close()
        await self._trail.close()

    async def stop(self) -> None:
        """The end of what `start` began: drained, closed, telemetry flushed."""
        await self.drain()
        await self.close()
        telemetry_setup.shutdown()


def build_guard(config: Config, detector: Detector, engine: PolicyEngine) -> Guard:
    """A guard on the configured stores: the audit trail, the escalation outbox, the check queue and,
    for a fleet, the shared verdict cache. Blocking (it connects and migrates): call it off the loop."""
    policy = config.policy
    audit = AuditStore(policy.audit, config.store) if policy.audit.enabled else None
    budgets = [p.latency_budget_s or 0.0 for p in policy.profiles.values()]
    call_timeout_s = min([config.queue.timeout_s, *(b for b in budgets if b > 0)])
    queue = open_queue(config.queue, policy.audit.path, config.proxy.queue_size,
                       max([config.judge.timeout_s, *budgets]), call_timeout_s, policy.audit.synchronous)
    cache = DetectionCache(config.queue.url, config.queue.cache_ttl_s, config.queue.fleet_key, call_timeout_s) \
        if config.queue.url and config.queue.fleet_key and config.queue.cache_ttl_s else None
    shared = queue if isinstance(queue, RedisCheckQueue) else None
    checker = Checker(detector, engine, config, cache, shared if config.proxy.inline_via == "workers" else None)
    trail = Trail(config, engine, audit, Escalator(policy.escalation, audit))
    shadow = Shadow(config, audit) if config.shadow.sample > 0 else None
    settler = Settler(checker, engine, config, trail, shadow)
    return Guard(settler, Later(queue, config.proxy, trail, checker, shared))


async def start(config: Config, detector: Detector | None = None) -> Guard:
    """The whole settle side from a config, started: telemetry, the detector (built unless given; it may start the
    embedded judge), the judges it calls probed (unless its checks go to the fleet's workers), policy, the stores and
    the consumer of the check queue. `Guard.stop` ends what this began."""
    telemetry_setup.configure(config.telemetry)
    if detector is None:
        detector = await asyncio.to_thread(build_detector, config)
    if config.proxy.inline_via == "process" or config.proxy.workers:  # else the worker pool judges, not we
        await require_judges(config, getattr(detector, "llm", None))
    guard = await asyncio.to_thread(build_guard, config, detector, PolicyEngine(config.policy))
    await guard.begin()
    return guard
