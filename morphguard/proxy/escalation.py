"""Escalation: flagged decisions POSTed as JSON to a webhook, retried with backoff.

Each escalation goes into the audit store's outbox before the first attempt, claimed by the process that
wrote it. A process that dies while the webhook is down leaves it `pending`; its claim goes stale and a
sweep (every process sweeps, at start and then periodically) takes it over, so with several replicas on
one store each escalation is delivered by one of them at a time. What the webhook never takes ends
`undelivered`, kept for `morphguard audit --undelivered`. Without an audit store
(`policy.audit.enabled: false`) delivery is best effort, in memory.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)

from morphguard.config import EscalationSettings
from morphguard.policy.audit import AuditStore, process_identity

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

    async def submit(self, record: dict[str, Any]) -> None:
        """Write to the outbox, then deliver in the background: an escalation never delays the answer."""
        outbox_id = None
        if self.audit is not None:
            try:
                outbox_id = await asyncio.to_thread(self.audit.add_escalation, str(record.get("request_id")), record,
                                                    self.owner)
            except Exception:  # the outbox is broken: still try to deliver, from memory
                log.exception("escalation %s: outbox write failed", record.get("request_id"))
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
        while True:
            await asyncio.sleep(self.settings.claim_timeout_s / 3)
            try:
                taken = await self._take(audit, self.settings.claim_timeout_s)
                if taken:
                    log.info("took over %d escalations whose deliverer went silent", taken)
            except Exception:  # the store is down for now: the next sweep tries again
                log.exception("escalation sweep failed")

    def _spawn(self, outbox_id: int | None, record: dict[str, Any]) -> None:
        task = asyncio.create_task(self._deliver_and_mark(outbox_id, record))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _deliver_and_mark(self, outbox_id: int | None, record: dict[str, Any]) -> None:
        try:
            delivered, attempts, error = await self.deliver(record, outbox_id)
        except _TakenOver:
            return
        if not delivered:
            log.warning("escalation %s not delivered (%s); kept in the audit store", record.get("request_id"), error)
        if self.audit is not None and outbox_id is not None:
            try:
                await asyncio.to_thread(self.audit.escalation_outcome, outbox_id, delivered, attempts, error)
            except Exception:  # left pending: delivered again at the next start (at-least-once)
                log.exception("escalation %s: outbox update failed", record.get("request_id"))

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
                    await self._post(record)
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
        except Exception:  # cannot renew now: deliver anyway (at-least-once over at-most-once)
            log.exception("escalation %s: claim renewal failed", outbox_id)
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
