"""What a test counts of the text a check reads: a compiled pattern standing in for the module's own, counting the
characters it is asked to scan."""

from __future__ import annotations

import re
from collections.abc import Iterator


class Reading:
    """`pattern`, adding to `counts[name]` the characters each `finditer` is asked to scan (from `pos` to `endpos`)."""

    def __init__(self, pattern: re.Pattern[str], counts: dict[str, int], name: str) -> None:
        self.pattern, self.counts, self.name = pattern, counts, name

    def finditer(self, text: str, pos: int = 0, endpos: int | None = None) -> Iterator[re.Match[str]]:
        end = len(text) if endpos is None else min(endpos, len(text))
        self.counts[self.name] += max(0, end - pos)
        return self.pattern.finditer(text, pos, end)
