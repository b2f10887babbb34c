"""Escalation: flagged decisions POSTed as JSON to a webhook, retried with backoff; what cannot be delivered
goes to the audit store's undelivered table, so no escalation is ever lost.
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
from morphguard.policy.audit import AuditStore

log = logging.getLogger(__name__)


class _Retryable(Exception):
    """A webhook failure worth another attempt: no connection, timeout, 429 or 5xx."""


class Escalator:
    def __init__(self, settings: EscalationSettings, audit: AuditStore | None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.settings = settings
        self.audit = audit
        self._client = httpx.AsyncClient(timeout=settings.timeout_s, transport=transport,
                                         headers={k: v.get_secret_value() for k, v in settings.headers.items()})
        self._pending: set[asyncio.Task[None]] = set()

    def submit(self, record: dict[str, Any]) -> None:
        """Deliver in the background: an escalation never delays the answer."""
        task = asyncio.create_task(self.deliver(record))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def deliver(self, record: dict[str, Any]) -> bool:
        if not self.settings.webhook_url:
            self._keep(record, "no escalation webhook configured (policy.escalation.webhook_url)", 0)
            return False
        attempts = 0
        try:
            async for attempt in AsyncRetrying(stop=stop_after_attempt(self.settings.max_attempts),
                                               wait=wait_random_exponential(multiplier=0.2, max=5),
                                               retry=retry_if_exception_type(_Retryable), reraise=True):
                with attempt:
                    attempts += 1
                    await self._post(record)
            return True
        except Exception as exc:  # undeliverable after the retries, or refused: keep it
            self._keep(record, f"{type(exc).__name__}: {exc}"[:300], attempts)
            return False

    async def _post(self, record: dict[str, Any]) -> None:
        try:
            response = await self._client.post(self.settings.webhook_url or "", json=record)
        except httpx.TransportError as exc:
            raise _Retryable(f"webhook unreachable: {type(exc).__name__}") from None
        if response.status_code == 429 or response.status_code >= 500:
            raise _Retryable(f"webhook answered {response.status_code}")
        if response.status_code >= 400:
            raise RuntimeError(f"webhook refused the escalation with {response.status_code}")

    def _keep(self, record: dict[str, Any], error: str, attempts: int) -> None:
        log.warning("escalation %s not delivered (%s); kept in the audit store", record.get("request_id"), error)
        if self.audit is not None:
            self.audit.undelivered(str(record.get("request_id")), record, error, attempts)

    async def aclose(self, grace_s: float) -> None:
        if self._pending:
            await asyncio.wait(list(self._pending), timeout=grace_s)
        await self._client.aclose()
