"""Verdicts as span annotations in Arize Phoenix, so people can filter and chart traces by hallucination
score in Phoenix itself (`telemetry.annotations.url`).

A background thread posts each annotation once its span has had time to be exported and ingested, and
posts again later while Phoenix says the span does not exist yet. Annotations are a convenience of the
tracing backend; the audit trail is the record, so one that cannot be delivered is logged and dropped.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from typing import Any

import httpx

from morphguard.config import AnnotationSettings

log = logging.getLogger(__name__)
_MAX_TRIES = 10


class AnnotationSink:
    def __init__(self, settings: AnnotationSettings) -> None:
        assert settings.url is not None
        self.settings = settings
        headers = {"authorization": f"Bearer {settings.api_key.get_secret_value()}"} if settings.api_key else {}
        self._client = httpx.Client(base_url=settings.url.rstrip("/"), headers=headers, timeout=10)
        self._due: list[tuple[float, int, dict[str, Any], int]] = []  # (when, order, annotation, tries)
        self._order = itertools.count()
        self._wake = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="phoenix-annotations", daemon=True)
        self._thread.start()

    def submit(self, span_id: str, *, label: str, score: float, explanation: str, identifier: str) -> None:
        annotation = {"span_id": span_id, "name": self.settings.name, "annotator_kind": "LLM",
                      "result": {"label": label, "score": score, "explanation": explanation},
                      "identifier": identifier, "metadata": {"source": "morphguard"}}
        self._schedule(annotation, 0)

    def _schedule(self, annotation: dict[str, Any], tries: int) -> None:
        with self._wake:
            heapq.heappush(self._due, (time.monotonic() + self.settings.delay_s * (tries + 1), next(self._order),
                                       annotation, tries))
            self._wake.notify()

    def _run(self) -> None:
        from opentelemetry.instrumentation.utils import suppress_instrumentation

        while True:
            with self._wake:
                while not self._due and not self._closing:
                    self._wake.wait()
                if not self._due:
                    return
                when, _, annotation, tries = self._due[0]
                wait = when - time.monotonic()
                if wait > 0 and not self._closing:
                    self._wake.wait(wait)
                    continue
                heapq.heappop(self._due)
            with suppress_instrumentation():  # our own calls to the backend are no one's trace
                self._post(annotation, tries)

    def _post(self, annotation: dict[str, Any], tries: int) -> None:
        status: int | None
        try:
            status = self._client.post("/v1/span_annotations", params={"sync": "true"},
                                       json={"data": [annotation]}).status_code
        except httpx.HTTPError as exc:
            status, error = None, type(exc).__name__
        else:
            if status < 300:
                return
            error = f"HTTP {status}"
        retry = status is None or status in (404, 429) or status >= 500  # not there yet, busy, or down
        if retry and tries + 1 < _MAX_TRIES and not self._closing:
            self._schedule(annotation, tries + 1)  # 404: the span has not been ingested yet
        else:
            log.warning("span annotation for %s not delivered (%s)", annotation["span_id"], error)

    def close(self, timeout_s: float = 5.0) -> None:
        """Post what is due now (what waits for a span still missing is dropped), then stop."""
        with self._wake:
            self._closing = True
            self._wake.notify()
        self._thread.join(timeout_s)
        self._client.close()
