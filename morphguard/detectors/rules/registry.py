"""The rule interface and the one list of registered rules.

A rule reads an answer against facts its context holds in a form the rule knows (a JSON record's yes/no fields, a
record's opening hours; a team's own could read dosages or dates) and returns the claims those facts contradict.
It calls no LLM. A rule module ends with `register(Rule(...))`; the package imports every module in it, so the
detectors that read rules (`grounding`, and through it `combined`) find a new rule with no other edit, and read a
context with no rule at all as prose.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from morphguard.models import Evidence

T = TypeVar("T")


@dataclass(frozen=True)
class Conflict:
    """A claim of the answer that a fact of the context contradicts."""

    start: int  # the claim, as a reviewer should see it pointed at
    end: int
    at: int  # where the answer names the fact: findings are listed in this order
    fact: str  # which fact, e.g. the record field "attributes.WiFi" or "hours.Monday"
    evidence: Evidence | None  # where the context states it
    reason: str  # a reviewer's one-line reason


@dataclass(frozen=True)
class Reading:
    """What a rule found in one check."""

    conflicts: list[Conflict] = field(default_factory=list)
    # The context's facts this rule reads answers against, where the context is made of them alone (every passage
    # that says anything is, say, a JSON record). Such an answer is read against those facts rather than as prose:
    # `grounding` points at no reworded word and looks for no changed copy, and `combined` asks no judge
    # (its `record_fields` feature). 0: the context is prose, or holds prose beside the facts.
    facts: int = 0


class Context:
    """What a rule reads besides the answer: the passages, and what rules make of them, each made once per check
    (`shared`), so that two rules reading one record parse it once."""

    def __init__(self, passages: list[str]) -> None:
        self.passages = passages
        self._made: dict[Callable[[list[str]], Any], Any] = {}

    def shared(self, make: Callable[[list[str]], T]) -> T:
        """`make(passages)`, made at the first call of this check and kept for the others."""
        if make not in self._made:
            self._made[make] = make(self.passages)
        made: T = self._made[make]
        return made


@dataclass(frozen=True)
class Rule:
    name: str
    read: Callable[[str, Context], Reading]  # the answer, its context
    # The version of what decides its findings, for eval fingerprints: results found under another are stale.
    version: int = 1
    # The fingerprint key the version goes under (default: the name). Rules read from one shared reading and changed
    # together share a key and a version.
    versioned_as: str = ""


RULES: dict[str, Rule] = {}


def register(rule: Rule) -> Rule:
    if rule.name in RULES:
        raise ValueError(f"rule {rule.name!r} is registered twice")
    key = rule.versioned_as or rule.name
    if any((other.versioned_as or other.name) == key and other.version != rule.version for other in RULES.values()):
        raise ValueError(f"rule {rule.name!r}: version {rule.version} differs from the other rules versioned as "
                         f"{key!r}")
    RULES[rule.name] = rule
    return rule


@dataclass(frozen=True)
class Findings:
    """Every registered rule's reading of one answer."""

    conflicts: list[Conflict]  # in the order the answer names the facts
    facts: int  # `Reading.facts`, summed over the rules

    @property
    def about_facts(self) -> bool:
        """Whether the answer is read against the context's facts rather than as prose (`Reading.facts`)."""
        return self.facts > 0


def read_all(answer: str, passages: list[str]) -> Findings:
    """What every registered rule finds in `answer` against `passages`."""
    context = Context(passages)
    readings = [rule.read(answer, context) for rule in RULES.values()]
    conflicts = sorted((c for r in readings for c in r.conflicts), key=lambda c: (c.at, c.fact))
    return Findings(conflicts, sum(r.facts for r in readings))


def fingerprint() -> dict[str, int]:
    """The registered rules' versions, by `Rule.versioned_as`, for the fingerprints of the detectors that read
    rules."""
    return {rule.versioned_as or rule.name: rule.version for rule in RULES.values()}
