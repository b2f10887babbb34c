"""What a check costs, per stage: each stage runs in its own span and counts the replies it received."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from morphguard import telemetry
from morphguard.models import StageCost
from morphguard.telemetry import names

T = TypeVar("T")
C = TypeVar("C")


@dataclass
class Meter:
    """Cost of one check, per stage, from the completions it received."""

    stages: dict[str, StageCost] = field(default_factory=dict)

    async def run(self, stage: str, work: Callable[[], Awaitable[T]]) -> T:
        """Run one stage inside its span; `work` is called there, so the calls it starts are its children."""
        started = time.perf_counter()
        with telemetry.stage_span(stage) as span:
            try:
                return await work()
            finally:
                cost = self.stages.setdefault(stage, StageCost())
                cost.seconds += time.perf_counter() - started
                span.set_attribute(names.STAGE_CALLS, cost.llm_calls)
                span.set_attribute(names.INPUT_TOKENS, cost.input_tokens)
                span.set_attribute(names.CACHED_INPUT_TOKENS, cost.cached_input_tokens)
                span.set_attribute(names.OUTPUT_TOKENS, cost.output_tokens)

    def count(self, stage: str, completion: C) -> C:
        self.stages.setdefault(stage, StageCost()).count(completion)
        return completion

    def hit(self, stage: str) -> None:
        """A result reused from a cache of our own: counted as a cached call."""
        self.stages.setdefault(stage, StageCost()).cached_calls += 1
