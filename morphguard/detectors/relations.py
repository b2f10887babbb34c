"""Rule-based antonyms: a contradiction made without an LLM call, where a rule surely applies.

A changed number (a year moved, a count altered) or a flipped polarity ("is" ↔ "is not") contradicts a
statement that asserts it. Statements no rule fits get their antonyms from the judge as usual.
"""

from __future__ import annotations

import re

_NUMBER = re.compile(r"(?<![\w.])(\d+(?:[.,]\d+)?)(?![\w.,]*\d)")
_AUXILIARY = re.compile(
    r"\b(is|are|was|were|can|could|will|would|should|does|do|did|has|have|had|must|may)(\s+not\b|n't\b)?", re.I)
_CONTRACTED = {"can't": "can", "won't": "will", "cannot": "can"}


def _changed(number: str) -> str:
    if "." in number or "," in number:
        value = float(number.replace(",", ""))
        return f"{value * 2:g}"
    value = int(number)
    if 1000 <= value <= 2100:  # a year
        return str(value + 7)
    return str(value * 2 + 1)


def negate(statement: str) -> str | None:
    """A contradiction of `statement` by a sure rule, or None when no rule applies."""
    number = _NUMBER.search(statement)
    if number:
        return statement[:number.start()] + _changed(number.group(1)) + statement[number.end():]
    for contracted, plain in _CONTRACTED.items():
        found = re.search(rf"\b{contracted}\b", statement, re.I)
        if found:
            return statement[:found.start()] + plain + statement[found.end():]
    auxiliary = _AUXILIARY.search(statement)
    if auxiliary:
        verb = auxiliary.group(1)
        flipped = verb if auxiliary.group(2) else f"{verb} not"
        return statement[:auxiliary.start()] + flipped + statement[auxiliary.end():]
    return None
