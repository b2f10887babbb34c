"""What the checks of one growing answer share: a stream checked as it flows checks the answer up to each finished
sentence, then the whole, and each check is of the same answer, only longer.

A `Memo` lives as long as the stream. It holds the judge calls the stream may still make (`budget`: the cap bounds
the stream, not each check) and what each detector chose to remember of its earlier checks (`kept`, by detector):
`sentences` keeps each sentence's verdict, so that the judge is asked about each sentence once per stream. The
checker opens it around each check of the stream (`remembering`); a detector reads it with `current()`. A check
made outside a stream has none, and remembers nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar

from morphguard.llm.client import CallBudget

T = TypeVar("T")


@dataclass
class Memo:
    """One growing answer's checks: their shared judge-call budget (None: each check has its own, the configured cap)
    and each detector's notes."""

    budget: CallBudget | None = None
    kept: dict[str, Any] = field(default_factory=dict)

    def of(self, detector: str, new: Callable[[], T]) -> T:
        """The notes `detector` keeps, made by `new` at its first check of the answer."""
        if detector not in self.kept:
            self.kept[detector] = new()
        notes: T = self.kept[detector]
        return notes


_MEMO: ContextVar[Memo | None] = ContextVar("morphguard_memo", default=None)


@contextmanager
def remembering(memo: Memo | None) -> Iterator[None]:
    """The checks run inside (and the tasks and threads they start) read and add to `memo`."""
    token = _MEMO.set(memo)
    try:
        yield
    finally:
        _MEMO.reset(token)


def current() -> Memo | None:
    """The memo of the answer being checked, where its checks share one."""
    return _MEMO.get()
