"""Consuming the async check queue, in `serve` (`proxy.workers` tasks) and in `morphguard worker`: each entry is
settled as an inline check would be (`Settler.settle_queued`, its own trace linked to the request's) and acknowledged
only once its audit row, and the outbox row of its escalation, are committed. While the store is unreachable an
entry keeps its claim (renewed) and its row is written again with backoff. Jobs a proxy waits on
(`proxy.inline_via: workers`) are answered, not audited.

Beside the consumers run the queue's observer (gauges, claims renewed, outages noticed) and, on Redis, the
reconciliation of what this process queued (`settle.journal`): queued again if Redis lost it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from tenacity import AsyncRetrying, retry_if_exception, wait_exponential_jitter

from morphguard import telemetry
from morphguard.settle.check import Settler
from morphguard.settle.later import Later
from morphguard.settle.values import Answer, CheckRequest
from morphguard.store.queue import Entry, QueueUnavailable

log = logging.getLogger(__name__)


class Consumer:
    def __init__(self, later: Later, settler: Settler) -> None:
        self.later, self.settler, self.trail = later, settler, settler.trail
        self.queue, self.audit, self.settings = later.queue, settler.trail.audit, later.settings
        self._workers: list[asyncio.Task[None]] = []
        self._busy = 0  # queue entries this process has taken and not finished

    async def _recover_streams(self) -> None:
        interrupted = await self.trail.recover_streams()
        if interrupted:
            log.warning("%d streams cut by a crash recorded as stream_interrupted", interrupted)

    async def start(self) -> None:
        """Recover what a previous run left queued, resume undelivered escalations, start the tasks."""
        try:
            waiting = await self.queue.recover()
        except QueueUnavailable as exc:  # the consumers and the observer keep trying
            self.later.outage.failed(exc)
            waiting = 0
        if waiting and self.settings.workers:
            log.info("%d async checks waiting in the queue", waiting)
        # from the background: a store that cannot write yet must not hold the start up (the rows wait for it)
        self.trail.in_background(self._recover_streams())
        resumed = await self.trail.escalator.resume()
        if resumed:
            log.info("resuming %d escalations left undelivered", resumed)
        self._workers = [asyncio.create_task(self._work()) for _ in range(self.settings.workers)]
        self._workers.append(asyncio.create_task(self._observe_queue()))
        if self.later.journal is not None:
            self._workers.append(asyncio.create_task(self._requeue_lost()))

    async def _observe_queue(self) -> None:
        """The queue's gauges, refreshed for the metric reader (its callbacks cannot await); the claims of the
        entries being worked on renewed; the queue's and the store's outages noticed, and their ends."""
        while True:
            try:
                stats = await self.queue.stats()
                await self.queue.keep_claims()
            except QueueUnavailable as exc:  # reported by /readyz; the gauges keep their last values
                self.later.outage.failed(exc)
            except Exception as exc:
                log.debug("queue stats unavailable: %s", exc)
            else:
                self.later.outage.ok()
                if self.audit is not None:
                    stats["escalation_backlog"] = await self._escalations_waiting()
                telemetry.queue_observed(stats)
            await asyncio.sleep(2.0)

    async def _escalations_waiting(self) -> int:
        assert self.audit is not None
        try:
            return await asyncio.to_thread(self.audit.escalation_backlog)
        except Exception:  # the store is away: its outage is logged where rows are written
            return 0

    async def _requeue_lost(self) -> None:
        """Every 2 s: forget what is recorded; queue again what Redis lost (it came back without its data)."""
        assert self.later.journal is not None and self.later.shared is not None and self.audit is not None
        journal, pool, audit = self.later.journal, self.later.shared, self.audit
        while True:
            await asyncio.sleep(2.0)
            if not len(journal):
                continue
            try:
                epoch = await pool.current_epoch()
                journal.forget(await asyncio.to_thread(audit.recorded, journal.older_than(2.0)))
                lost = journal.lost(epoch)
                if lost:
                    journal.forget(await asyncio.to_thread(audit.recorded, [key for key, _ in lost]))
                    await self._requeue(journal.lost(epoch))
            except Exception as exc:  # the queue or the store is away: the next round tries again
                log.debug("cannot reconcile queued checks now: %s", exc)

    async def _requeue(self, lost: list[tuple[str, dict[str, Any]]]) -> None:
        assert self.later.journal is not None and self.later.shared is not None
        log.warning("Redis lost %d queued checks (it restarted without its data): queueing them again", len(lost))
        for key, payload in lost:
            # tries=1: the worker first looks whether a worker recorded it before Redis lost it
            if await self.later.shared.put(key, payload, tries=1):
                self.later.journal.add(key, payload, self.later.shared.epoch)

    async def _work(self) -> None:
        pause = 0.5
        while True:
            try:
                await self._consume()
            except asyncio.CancelledError:
                raise
            except QueueUnavailable as exc:  # Redis away: one log line for the outage, not one per try
                self.later.outage.failed(exc)
                await asyncio.sleep(pause)
                pause = min(pause * 2, 5.0)
            except Exception:  # a bug, or the queue failed in a way we do not know: keep the worker alive
                log.exception("async check queue failed; retrying")
                await asyncio.sleep(1.0)

    async def _consume(self) -> None:
        while True:
            entry = await self.queue.take(wait_s=1.0)
            self.later.outage.ok()
            if entry is not None:
                self._busy += 1
                try:
                    await self._finish(entry)
                finally:
                    self._busy -= 1

    async def _finish(self, entry: Entry) -> None:
        if entry.reply_to is not None:  # an inline check a proxy waits for
            assert self.later.shared is not None
            await self.later.shared.answer(entry, await self.settler.checker.detect_for_caller(entry))
            return
        request = CheckRequest.from_dict(entry.payload["request"])
        completion = entry.payload["completion"]
        if entry.tries and await self._recorded(request.request_id):
            log.info("async check of %s: recorded on an earlier delivery", request.request_id)
            await self._acknowledge(self.queue.done, entry)
            return
        try:
            if entry.poisoned:
                await self.trail.account(request, "check_crashed", self.settler.checker.answer_text(Answer(completion)),
                                         wait_for_store=True)
                await self._acknowledge(self.queue.dead, entry, "check_crashed")
                return
            record = (await self.settler.settle_queued(request, Answer(completion))).record
            log.info("async check of %s: score %s, flagged %s, action %s", record.request_id,
                     record.score, record.flagged, record.action)
        except Exception:
            log.exception("async check of %s crashed (try %d)", request.request_id, entry.tries + 1)
            await self.queue.retry(entry)
            return
        await self._acknowledge(self.queue.done, entry)

    async def _recorded(self, request_id: str) -> bool:
        if self.audit is None:
            return False
        try:
            return request_id in await asyncio.to_thread(self.audit.recorded, [request_id])
        except Exception:  # the store is away: check again; the write will wait for it and change nothing
            return False

    async def _acknowledge(self, how: Callable[..., Awaitable[None]], entry: Entry, *args: Any) -> None:
        """Acknowledge an entry whose record is written, however long the queue is away: not acknowledged, it
        would be checked again."""
        async for attempt in AsyncRetrying(retry=retry_if_exception(lambda e: isinstance(e, QueueUnavailable)),
                                           wait=wait_exponential_jitter(initial=0.2, max=5.0), reraise=True):
            with attempt:
                try:
                    await how(entry, *args)
                except QueueUnavailable as exc:
                    self.later.outage.failed(exc)
                    raise
        self.later.outage.ok()

    async def stop(self) -> None:
        """Finish what is under way within the grace period; what is left stays queued.

        On its own queue this process also works the backlog down first; on a shared queue other workers
        take what is waiting, and only this process's claimed checks are its to finish.
        """
        grace = self.settings.shutdown_grace_s
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and (self._busy or (self._workers_consume_local()
                                                              and await self.queue.backlog() > 0)):
            await asyncio.sleep(0.1)
        if self.trail.background:
            await asyncio.wait(list(self.trail.background), timeout=max(1.0, deadline - time.monotonic()))
        if self.trail.background:
            log.error("shutdown: %d audit rows not written (the audit store is unreachable)",
                      len(self.trail.background))
            for task in list(self.trail.background):
                task.cancel()
        for worker in self._workers:
            worker.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        if not self.queue.shared:
            left = await self.queue.backlog()
            if left:
                log.warning("shutdown: %d async checks left queued for the next start", left)
        await self.trail.escalator.aclose(max(0.0, deadline - time.monotonic()))

    def _workers_consume_local(self) -> bool:
        return not self.queue.shared and self.settings.workers > 0
