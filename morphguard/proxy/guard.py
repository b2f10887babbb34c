"""Runs the detector for the proxy: inline, or on a bounded background queue with a worker pool."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from morphguard.config import ProxySettings
from morphguard.detectors import Detector
from morphguard.errors import MorphguardError
from morphguard.models import Detection, RagInput
from morphguard.proxy import verdict as v

log = logging.getLogger(__name__)


class Guard:
    def __init__(self, detector: Detector, settings: ProxySettings) -> None:
        self.detector = detector
        self.settings = settings
        self._queue: asyncio.Queue[tuple[RagInput, str, str | None]] = asyncio.Queue(settings.queue_size)
        self._workers: list[asyncio.Task[None]] = []
        self.dropped = 0

    def action_for(self, detection: Detection) -> str:
        return v.BLOCK if detection.flagged and self.settings.on_flagged == "block" else v.ANNOTATE

    async def check(self, rag: RagInput | None, answer: str, source: str | None,
                    can_block: bool = True) -> dict[str, Any]:
        if rag is None:
            return v.not_checked("no_context")
        if not answer.strip():
            return v.not_checked("no_answer")
        started = time.perf_counter()
        try:
            detection = await self.detector.detect(rag, answer)
        except MorphguardError as exc:  # fail open: the answer goes out unchecked, and we say so
            log.warning("check failed, answer passed unchecked: %s", exc)
            return v.not_checked("detector_error")
        action = self.action_for(detection)
        if action == v.BLOCK and not can_block:
            action = v.ANNOTATE
        return v.checked(detection, action, (time.perf_counter() - started) * 1000, source)

    async def check_later(self, rag: RagInput | None, answer: str, source: str | None) -> dict[str, Any] | None:
        """Queue a check; the verdict to send now, or None when the caller must check inline (queue full)."""
        if rag is None:
            return v.not_checked("no_context")
        try:
            self._queue.put_nowait((rag, answer, source))
        except asyncio.QueueFull:
            if self.settings.on_queue_full == "inline":
                return None
            self.dropped += 1
            log.warning("async check queue full (%d): check dropped", self.settings.queue_size)
            return v.not_checked("dropped")
        return v.not_checked("queued", mode="async")

    def start(self) -> None:
        self._workers = [asyncio.create_task(self._work()) for _ in range(self.settings.workers)]

    async def _work(self) -> None:
        while True:
            rag, answer, source = await self._queue.get()
            try:
                result = await self.check(rag, answer, source, can_block=False)
                log.info("async check: %s", {k: result.get(k) for k in ("checked", "score", "flagged", "reason")})
            except Exception:
                log.exception("async check crashed")
            finally:
                self._queue.task_done()

    async def stop(self) -> None:
        """Let queued checks finish within the grace period, then stop the workers."""
        try:
            await asyncio.wait_for(self._queue.join(), timeout=self.settings.shutdown_grace_s)
        except asyncio.TimeoutError:
            log.warning("shutdown: %d queued checks abandoned after %.0f s", self._queue.qsize(),
                        self.settings.shutdown_grace_s)
        for worker in self._workers:
            worker.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
