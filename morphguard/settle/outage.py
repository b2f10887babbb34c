"""Outages logged as state changes: one line when a dependency starts failing, one when it works again,
however many calls fail in between (a Redis restart must not turn into thousands of tracebacks)."""

from __future__ import annotations

import logging
import time


class Outage:
    def __init__(self, what: str, log: logging.Logger) -> None:
        self.what, self.log = what, log
        self._since: float | None = None
        self._failures = 0

    @property
    def down(self) -> bool:
        return self._since is not None

    def failed(self, exc: BaseException) -> None:
        if self._since is None:
            self._since = time.monotonic()
            first = (str(exc).strip().splitlines() or [""])[0]
            self.log.error("%s unavailable: %s: %s", self.what, type(exc).__name__, first[:300])
        self._failures += 1

    def ok(self) -> None:
        if self._since is not None:
            self.log.warning("%s available again after %.1f s (%d failed calls meanwhile)", self.what,
                             time.monotonic() - self._since, self._failures)
            self._since, self._failures = None, 0
