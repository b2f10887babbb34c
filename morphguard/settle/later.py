"""The queue's front: a check queued durably (`proxy.mode: async`, or a stream relayed as it came) instead of run
before the answer goes out. Once queued only annotating, auditing and escalating remain possible; the consumer
(`settle.consumer`) runs what is queued. What a replica queued on Redis stays in its journal (`settle.journal`)
until recorded, and is queued again if Redis comes back without it.
"""

from __future__ import annotations

import logging

from morphguard.config import ProxySettings
from morphguard.policy.record import DecisionRecord
from morphguard.settle.check import Checker
from morphguard.settle.journal import Journal
from morphguard.settle.outage import Outage
from morphguard.settle.trail import Trail
from morphguard.settle.values import Answer, CheckRequest
from morphguard.store.queue import CheckQueue, QueueUnavailable
from morphguard.store.redis_queue import RedisCheckQueue

log = logging.getLogger(__name__)


class Later:
    def __init__(self, queue: CheckQueue, settings: ProxySettings, trail: Trail, checker: Checker,
                 shared: RedisCheckQueue | None = None) -> None:
        self.queue = queue
        self.settings = settings
        self.trail = trail
        self.checker = checker
        self.shared = shared  # the fleet's Redis queue, when there is one
        self.outage = Outage("async check queue", log)
        self._full = Outage("room in the async check queue", log)
        # What this process queued on Redis, until recorded: queued again if Redis comes back without it.
        self.journal = Journal() if shared is not None and trail.audit is not None else None

    async def check_later(self, request: CheckRequest, answer: Answer) -> DecisionRecord | None:
        """Queue a check durably; the record to send now, or None when the caller must check inline.

        A queue that is full, or cannot be reached, gets `proxy.on_queue_full`: check inline, or record the
        request as not checked. While the queue is known to be away no put is tried: the observer finds
        it back.
        """
        if request.rag is None:
            return await self.trail.account(request, "no_context", self.checker.answer_text(answer))
        payload = {"request": request.to_dict(), "completion": answer.completion}
        reason = "queue_unavailable"
        if not self.outage.down:
            try:
                stored = await self.queue.put(request.request_id, payload)
            except QueueUnavailable as exc:
                self.outage.failed(exc)
            else:
                self.outage.ok()
                if stored:
                    self._full.ok()
                    if self.journal is not None:
                        assert self.shared is not None
                        self.journal.add(request.request_id, payload, self.shared.epoch)
                    return request.pending("queued")
                reason = "queue_full"
                self._full.failed(RuntimeError(f"{self.settings.queue_size} checks waiting"))
        if self.settings.on_queue_full == "inline":
            return None
        return await self.trail.account(request, reason, self.checker.answer_text(answer))
