"""What the checks of one growing answer share: a stream checked as it flows checks the answer up to each finished
sentence, then the whole, and each check is of the same answer, only longer.

A `Memo` lives as long as the stream. It holds the judge calls the stream may still make (`budget`: the cap bounds
the stream, not each check) and what each detector chose to remember of its earlier checks (`kept`, by detector):
`sentences` keeps each sentence's verdict, so that the judge is asked about each sentence once per stream. The
checker opens it around each check of the stream (`remembering`); a detector reads it with `current()`. A check
made outside a stream has none, and remembers nothing.

A check of a stream's prefix made by one of the fleet's workers takes the memo with it and brings back what it
learnt (`carried`, `arriving`, `learnt`, `take`): the notes that can travel (`Carried`: the `sentences` check's
verdicts) and the judge calls the stream has left, in the sealed job and reply (`store.sealed`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

from morphguard.llm.client import CallBudget

T = TypeVar("T")
log = logging.getLogger(__name__)


@runtime_checkable
class Carried(Protocol):
    """A detector's notes that can go with a check to another process and come back: as JSON, a dict of lists,
    which what another process found of the same answer extends."""

    def carried(self, beyond: dict[str, Any] | None = None) -> dict[str, Any]:
        """What the notes hold (`beyond`: less what that earlier `carried` of them held)."""
        ...

    def take(self, found: dict[str, Any]) -> None:
        """Add what another process's notes of the same answer hold (their `carried`)."""
        ...


@dataclass
class Memo:
    """One growing answer's checks: their shared judge-call budget (None: each check has its own, the configured cap)
    and each detector's notes; `arrived`: notes carried in from another process (or back from one, for a detector
    that has made none here), by detector, as `Carried.carried` writes them."""

    budget: CallBudget | None = None
    kept: dict[str, Any] = field(default_factory=dict)
    arrived: dict[str, dict[str, Any]] = field(default_factory=dict)
    # held by a check made elsewhere while it is away: the answer's checks go one at a time, each taking along what
    # the one before learnt (in one process, a check waits for the sentences another is asking about instead)
    away: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False, compare=False)

    def of(self, detector: str, new: Callable[[], T]) -> T:
        """The notes `detector` keeps, made by `new` at its first check of the answer (with what arrived for it)."""
        if detector not in self.kept:
            notes = new()
            if detector in self.arrived and isinstance(notes, Carried):
                notes.take(self.arrived[detector])
            self.kept[detector] = notes
        found: T = self.kept[detector]
        return found

    def carried(self) -> dict[str, Any]:
        """What a check made elsewhere takes along (`arriving`): the notes that travel, and the calls left."""
        notes = {**self.arrived, **{name: kept.carried() for name, kept in self.kept.items()
                                    if isinstance(kept, Carried)}}
        left = None if self.budget is None else max(0, self.budget.limit - self.budget.used)
        return {"notes": notes, "calls_left": left}

    @classmethod
    def arriving(cls, carried: dict[str, Any]) -> Memo:
        """The memo of a check made here of another process's growing answer, from what it carried (`carried`)."""
        left, notes = carried.get("calls_left"), carried.get("notes")
        return cls(CallBudget(left) if isinstance(left, int) else None,
                   arrived={name: found for name, found in notes.items() if isinstance(found, dict)}
                   if isinstance(notes, dict) else {})

    def learnt(self) -> dict[str, Any]:
        """What the checks made here added to what arrived, and the judge calls they made: the reply (`take`)."""
        return {"notes": {name: kept.carried(self.arrived.get(name)) for name, kept in self.kept.items()
                          if isinstance(kept, Carried)},
                "calls": 0 if self.budget is None else self.budget.used}

    def take(self, learnt: dict[str, Any]) -> None:
        """Add what a check made elsewhere learnt (`learnt`), its judge calls drawn from this memo's budget."""
        notes = learnt.get("notes")
        for name, found in (notes.items() if isinstance(notes, dict) else ()):
            kept = self.kept.get(name)
            if isinstance(kept, Carried) and isinstance(found, dict):
                kept.take(found)
            elif isinstance(found, dict):
                into = self.arrived.setdefault(name, {})
                for key, values in found.items():
                    if isinstance(values, list):
                        into.setdefault(key, []).extend(values)
        calls = learnt.get("calls")
        if self.budget is not None and isinstance(calls, int):
            self.budget.used += max(0, calls)


@functools.cache
def ignored(detector: str) -> None:
    """Say, once per process, that notes carried in for `detector` held entries it could not read (a fleet running
    mixed versions): they are left out, and the checks ask the judge again where they would have read them."""
    log.warning("notes of the %s check carried from another process held entries of an unknown shape: "
                "left out (do the fleet's processes run different versions?)", detector)


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
