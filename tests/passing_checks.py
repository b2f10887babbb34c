"""Checks for the stream engine (`settle.incremental.Checks`) that read none of the text: every prefix and the
whole answer pass at once, so that what a stream costs the engine itself can be counted or timed."""

from __future__ import annotations

from morphguard.policy.record import Released
from morphguard.settle.incremental import Closing, PrefixCheck


class Passing:
    fill = 1
    closed = False

    async def prefix(self, text: str) -> PrefixCheck:
        return PrefixCheck(flagged=False, blocks=False)

    async def whole(self, text: str) -> PrefixCheck:
        return PrefixCheck(flagged=False, blocks=False, whole=True)

    async def close(self, text: str, deciding: PrefixCheck, released: Released) -> Closing:
        return Closing({"action": "pass"})
