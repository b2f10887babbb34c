"""Failed logins to the review console, counted per client address and over all addresses, and the lockouts
they earn.

`login_failures` failed logins from one address within `login_window_s` lock that address out for
`login_lockout_s`; each further lockout doubles, up to `login_lockout_max_s`, until the address stays quiet for
a window after its lockout ends. `login_failures_overall` from all addresses together (one guesser spread over
many addresses) lock every address out the same way. While locked out, even the right key is refused, so a
lockout tells a guesser nothing.

Limitations: the counts live in this process's memory. With several processes (`serve --workers N`,
replicas) each counts its own, so a guesser gets up to N times the attempts, and a restart forgets them.
The address is the one uvicorn reports: behind a reverse proxy, every client is the proxy unless uvicorn
trusts its X-Forwarded-For (`forwarded_allow_ips`). The overall lockout lets a guesser lock everyone out for
its length: the price of bounding guesses from many addresses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from time import monotonic

from morphguard.config import ReviewSettings


@dataclass
class _Failures:
    times: list[float] = field(default_factory=list)  # of the failures since the last lockout, within the window
    lockout_s: float = 0.0  # the length of the last lockout; 0: none yet
    locked_until: float = 0.0


class LoginThrottle:
    """One console's counts; called from its event loop only, so without a lock."""

    def __init__(self, settings: ReviewSettings, clock: Callable[[], float] = monotonic) -> None:
        self.settings = settings
        self._clock = clock
        self._addresses: dict[str, _Failures] = {}
        self._overall = _Failures()

    def retry_after(self, address: str) -> float:
        """Seconds until a login from `address` is tried again; 0: now."""
        own = self._addresses.get(address)
        locked_until = max(self._overall.locked_until, own.locked_until if own else 0.0)
        return max(0.0, locked_until - self._clock())

    def failed(self, address: str) -> None:
        now = self._clock()
        self._forget_quiet(now)
        self._count(self._addresses.setdefault(address, _Failures()), self.settings.login_failures, now)
        self._count(self._overall, self.settings.login_failures_overall, now)

    def succeeded(self, address: str) -> None:
        self._addresses.pop(address, None)

    def _count(self, failures: _Failures, limit: int, now: float) -> None:
        failures.times = [t for t in failures.times if t > now - self.settings.login_window_s] + [now]
        if len(failures.times) >= limit:
            failures.times.clear()
            longer = 2 * failures.lockout_s if failures.lockout_s else self.settings.login_lockout_s
            failures.lockout_s = min(longer, self.settings.login_lockout_max_s)
            failures.locked_until = now + failures.lockout_s

    def _forget_quiet(self, now: float) -> None:
        """Forget addresses (and reset the overall count) quiet for a window since their last failure and
        lockout: what is kept stays bounded by what one window holds."""
        quiet_since = now - self.settings.login_window_s
        for address in [a for a, f in self._addresses.items() if _quiet(f, quiet_since)]:
            del self._addresses[address]
        if _quiet(self._overall, quiet_since):
            self._overall = _Failures()


def _quiet(failures: _Failures, since: float) -> bool:
    return failures.locked_until < since and all(t < since for t in failures.times)
