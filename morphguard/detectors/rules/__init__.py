"""Domain rules: claims an answer states against facts its context holds in a form a rule reads, found without an
LLM (`registry` says what a rule is). Each module here registers its rule on import, and this package imports all
of its modules, so a new rule is found by being here: `records` (a JSON record's yes/no fields) and `hours` (its
opening hours) are the built-in ones.
"""

from __future__ import annotations

import importlib
import pkgutil

from morphguard.detectors.rules.registry import (
    RULES,
    Conflict,
    Context,
    Findings,
    Reading,
    Rule,
    fingerprint,
    read_all,
    register,
)

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["RULES", "Conflict", "Context", "Findings", "Reading", "Rule", "fingerprint", "read_all", "register"]
