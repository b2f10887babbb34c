"""Escalation: flagged decisions POSTed as JSON to a webhook, retried with backoff.

Each escalation is written to the audit store's outbox in the transaction that records its decision,
claimed by the process that wrote it, before the first attempt. A process that dies while the webhook is
down leaves it `pending`; its claim goes stale and a sweep (every process sweeps, at start and then
periodically) takes it over, so with several replicas on one store each escalation is delivered by one
of them at a time. After an outage of the store a process takes no claim over for one claim period: owners
first write what they delivered while it was down. One that `max_attempts` attempts did not deliver waits
`undelivered` and is swept up again later, ever less often, for `retry_for_s` after its decision: an escalation
outlives a webhook outage of hours. Past that it stays `undelivered`, for `morphguard audit --undelivered`.
Without an audit store (`policy.audit.enabled: false`) delivery is best effort, in memory.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime
from typing import Any

import httpx
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_random_exponential,
)

from morphguard.config import EscalationSettings
from morphguard.policy.audit import AuditStore, process_identity
from morphguard.settle.outage import Outage

log = logging.getLogger(__name__)


class _Retryable(Exception):
    """A webhook failure worth another attempt: no connection, timeout, 429 or 5xx."""


class _TakenOver(Exception):
    """Another process claimed the escalation (this one was too slow to renew): it delivers it now."""


class Escalator:
    def __init__(self, settings: EscalationSettings, audit: AuditStore | None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.settings = settings
        self.audit = audit
        self._client = httpx.AsyncClient(timeout=settings.timeout_s, transport=transport,
                                         headers={k: v.get_secret_value() for k, v in settings.headers.items()})
        self._pending: set[asyncio.Task[None]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self.owner = process_identity()
        self.webhook = Outage("escalation webhook", log)
        self._store_was_down = False  # a renewal, an outcome or a sweep found the store unreachable

    def submit(self, record: dict[str, Any], outbox_id: int | None = None) -> None:
        """Deliver in the background: an escalation never delays the answer. `outbox_id`: its row in the
        outbox, written with its decision; None without an audit store (in memory, best effort)."""
        self._spawn(outbox_id, record)

    async def resume(self) -> int:
        """Take over what nobody delivers, now and then periodically; returns how many were taken now.

        On its own SQLite file a process is the only deliverer, so everything pending at start is its
        own; on a shared store only claims older than `claim_timeout_s` are.
        """
        if self.audit is None:
            return 0
        audit = self.audit
        taken = await self._take(audit, 0.0 if not audit.shared else self.settings.claim_timeout_s)
        self._sweeper = asyncio.create_task(self._sweep(audit))
        return taken

    async def _take(self, audit: AuditStore, stale_s: float) -> int:
        claimed = await asyncio.to_thread(audit.claim_escalations, self.owner, stale_s)
        for outbox_id, record in claimed:
            self._spawn(outbox_id, record)
        return len(claimed)

    async def _sweep(self, audit: AuditStore) -> None:
        store = Outage("escalation outbox", log)
        hold_until = 0.0
        while True:
            await asyncio.sleep(self.settings.claim_timeout_s / 3)
            try:
                if self._store_was_down and await asyncio.to_thread(audit.reachable):
                    # While the store was down no process could renew a claim or write what it delivered, so
                    # claims went stale that are not abandoned: their owners get one claim period to write first.
                    self._store_was_down = False
                    hold_until = time.monotonic() + self.settings.claim_timeout_s
                if self._store_was_down or time.monotonic() < hold_until:
                    continue
                taken = await self._take(audit, self.settings.claim_timeout_s)
            except Exception as exc:  # the store is down for now: the next sweep tries again
                store.failed(exc)
                self._store_was_down = True
                continue
            store.ok()
            if taken:
                log.info("took over %d escalations left pending or due for another try", taken)

    def _spawn(self, outbox_id: int | None, record: dict[str, Any]) -> None:
        task = asyncio.create_task(self._deliver_and_mark(outbox_id, record))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _deliver_and_mark(self, outbox_id: int | None, record: dict[str, Any]) -> None:
        try:
            delivered, attempts, error = await self.deliver(record, outbox_id)
        except _TakenOver:
            return
        retry_at = None if delivered else self._retry_at(record)
        if not delivered:
            log.info("escalation %s not delivered (%s); %s", record.get("request_id"), error,
                     "kept in the audit store" if retry_at is None else f"next try in {retry_at - time.time():.0f} s")
        if self.audit is not None and outbox_id is not None:
            await self._mark(outbox_id, record, delivered, attempts, error, retry_at)

    async def _mark(self, outbox_id: int, record: dict[str, Any], delivered: bool, attempts: int, error: str | None,
                    retry_at: float | None) -> None:
        """The outcome written to the outbox, asked again while the store cannot be reached (`unavailable`), for as
        long as the escalation may be retried: an escalation delivered but left `pending` is delivered a second time
        once its claim goes stale. Sweeps leave stale claims alone for a claim period after an outage (`_sweep`);
        the tries are at most a third of one apart, so the outcome lands within that hold, and a long outage costs
        each waiting escalation one try per third of a claim period."""
        audit = self.audit
        assert audit is not None

        def down(exc: BaseException) -> bool:
            if audit.unavailable(exc):
                self._store_was_down = True
                return True
            return False

        try:
            async for attempt in AsyncRetrying(stop=stop_after_delay(max(self.settings.claim_timeout_s,
                                                                         self.settings.retry_for_s)),
                                               wait=wait_random_exponential(
                                                   multiplier=0.2, max=self.settings.claim_timeout_s / 3),
                                               retry=retry_if_exception(down), reraise=True):
                with attempt:
                    await asyncio.to_thread(audit.escalation_outcome, outbox_id, delivered, attempts, error, retry_at)
        except Exception:  # left pending: its claim goes stale and a sweep delivers it (at-least-once)
            log.warning("escalation %s: outbox update failed; left pending", record.get("request_id"))

    def _retry_at(self, record: dict[str, Any]) -> float | None:
        """When to try again: after half the escalation's age (at least 1 s, at most `retry_max_interval_s`),
        so the gaps grow while the webhook stays down; None once `retry_for_s` has passed since the decision."""
        try:
            age = time.time() - datetime.fromisoformat(str(record.get("time"))).timestamp()
        except ValueError:
            age = 0.0
        if age >= self.settings.retry_for_s:
            return None
        return time.time() + min(self.settings.retry_max_interval_s, max(1.0, age / 2))

    async def deliver(self, record: dict[str, Any], outbox_id: int | None = None) -> tuple[bool, int, str | None]:
        """Delivered?, the attempts made and the last error."""
        if not self.settings.webhook_url:
            return False, 0, "no escalation webhook configured (policy.escalation.webhook_url)"
        attempts = 0
        try:
            async for attempt in AsyncRetrying(stop=stop_after_attempt(self.settings.max_attempts),
                                               wait=wait_random_exponential(multiplier=0.2, max=5),
                                               retry=retry_if_exception_type(_Retryable), reraise=True):
                with attempt:
                    if not await self._still_ours(outbox_id):
                        raise _TakenOver
                    attempts += 1
                    try:
                        await self._post(record)
                    except _Retryable as exc:
                        self.webhook.failed(exc)
                        raise
            self.webhook.ok()
            return True, attempts, None
        except _TakenOver:
            raise
        except Exception as exc:  # undeliverable after the retries, or refused
            return False, attempts, f"{type(exc).__name__}: {exc}"[:300]

    async def _still_ours(self, outbox_id: int | None) -> bool:
        if self.audit is None or outbox_id is None:
            return True
        try:
            return await asyncio.to_thread(self.audit.renew_claim, outbox_id, self.owner)
        except Exception as exc:  # cannot renew now: deliver anyway (at-least-once over at-most-once)
            log.debug("escalation %s: claim renewal failed: %s", outbox_id, exc)
            self._store_was_down = True
            return True

    async def _post(self, record: dict[str, Any]) -> None:
        try:
            response = await self._client.post(self.settings.webhook_url or "", json=record)
        except httpx.TransportError as exc:
            raise _Retryable(f"webhook unreachable: {type(exc).__name__}") from None
        if response.status_code == 429 or response.status_code >= 500:
            raise _Retryable(f"webhook answered {response.status_code}")
        if response.status_code >= 400:
            raise RuntimeError(f"webhook refused the escalation with {response.status_code}")

    async def aclose(self, grace_s: float) -> None:
        """Wait up to `grace_s` for deliveries under way; what is left stays pending for the next start."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._pending:
            await asyncio.wait(list(self._pending), timeout=grace_s)
        for task in list(self._pending):
            task.cancel()
        await self._client.aclose()
