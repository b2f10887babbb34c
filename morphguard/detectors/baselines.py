"""Baselines every result stands beside: the answer's length, and one direct judge call.

Paper 003 (Janiak et al.) shows that answer length alone rivals published detectors, so a detector
is only worth its cost where it beats `length`. `direct` asks the judge once whether the whole answer is
supported and which parts are not: the cheapest LLM check there is.
"""

from __future__ import annotations

import math
import time
from typing import Any

from morphguard.config import DirectSettings, LengthSettings
from morphguard.detectors.focus import focus
from morphguard.detectors.judgments import judgment_probabilities, parse_judgment
from morphguard.detectors.prompts import as_data, numbered, render
from morphguard.detectors.registry import DetectorSpec, changed_options, register
from morphguard.detectors.replies import json_list, strings
from morphguard.detectors.spans import locate
from morphguard.detectors.text import statements
from morphguard.lanes import in_thread
from morphguard.llm.client import LLMClient
from morphguard.models import (
    Cost,
    Detection,
    DetectionStats,
    Factoid,
    Judgment,
    RagInput,
    StageCost,
)


class LengthBaseline:
    """Longer answers are more often hallucinated: score = 1 − exp(−words / scale), no LLM involved."""

    name = "length"
    localizes = False  # says nothing about where in the answer

    def __init__(self, threshold: float = 0.5, scale_words: float = 100.0) -> None:
        self.threshold = threshold
        self.scale_words = scale_words

    async def detect(self, rag: RagInput, answer: str) -> Detection:
        words = len(answer.split())
        score = 1.0 - math.exp(-words / self.scale_words)
        return Detection(detector=self.name, score=score, threshold=self.threshold, flagged=score >= self.threshold,
                         settings={"scale_words": self.scale_words, "words": words})


class DirectJudge:
    """One call: is every statement of the answer supported by the passages, and which parts are not?

    The score is the judge's probability of NO at the verdict token when log-probabilities are
    available, else 1 for NO and 0 for YES. Each listed unsupported part becomes a factoid with its span.
    """

    name = "direct"

    def __init__(self, llm: LLMClient, threshold: float = 0.5, model: str | None = None,
                 soft_verdicts: bool = True, context_budget: int = 0) -> None:
        self.llm = llm
        self.threshold = threshold
        self.model = model
        self.soft_verdicts = soft_verdicts
        self.context_budget = context_budget

    async def detect(self, rag: RagInput, answer: str) -> Detection:
        started = time.perf_counter()
        # Pure Python over the whole context (seconds for a hostile multi-megabyte one): off the event loop.
        passages = numbered(await in_thread(focus, statements(answer), rag.passages, self.context_budget,
                                             size=rag.size(answer)))
        messages = [
            {"role": "system", "content": render("direct_system")},
            {"role": "user", "content": render("direct_user", passages=passages, question=as_data(rag.question),
                                               answer=as_data(answer))},
        ]
        schema: dict[str, Any] = {
            "type": "object",
            "properties": {"verdict": {"type": "string", "enum": ["YES", "NO"]},
                           "unsupported": {"type": "array", "items": {"type": "string"}, "maxItems": 8}},
            "required": ["verdict", "unsupported"],
        }
        reply = await self.llm.complete(messages, model=self.model, max_tokens=384, json_schema=schema,
                                        top_logprobs=5 if self.soft_verdicts else 0)
        parsed = parse_judgment(reply.text)
        probabilities = judgment_probabilities(reply.logprobs) if self.soft_verdicts else None
        if probabilities and parsed.parsed:
            yes, no = probabilities[Judgment.YES], probabilities[Judgment.NO]
            score = no / (yes + no) if yes + no > 0 else 0.5
        else:
            score = {Judgment.YES: 0.0, Judgment.NO: 1.0}.get(parsed.judgment, 0.5)
        factoids = []
        if parsed.judgment is not Judgment.YES:
            for text in strings(json_list(reply.text, "unsupported")):
                span = locate(text, answer)
                factoids.append(Factoid(text=text, start=span[0] if span else None, end=span[1] if span else None,
                                        score=score, label="unsupported",
                                        reason="the judge names it as not supported by the passages"))
        stage = StageCost(seconds=reply.seconds)
        stage.count(reply)
        return Detection(
            detector=self.name, score=score, threshold=self.threshold, flagged=score >= self.threshold,
            factoids=factoids,
            cost=Cost.of({"verify": stage}, time.perf_counter() - started),
            stats=DetectionStats(factoids=len(factoids), unparseable_verdicts=int(not parsed.parsed)),
            settings={"model": self.model, "soft_verdicts": self.soft_verdicts},
        )


register(DetectorSpec(
    name="length", settings=LengthSettings, models=lambda settings: [], fingerprint=changed_options,
    build=lambda settings, threshold, llm: LengthBaseline(threshold, settings.scale_words)))
register(DetectorSpec(
    name="direct", settings=DirectSettings, models=lambda settings: [settings.model],
    prompts=lambda settings: ["direct_system", "direct_user"],
    # Scored from log-probabilities (`logprob_reader`: see metarag._fingerprint).
    fingerprint=lambda settings: {**changed_options(settings), "logprob_reader": 2},
    build=lambda settings, threshold, llm: DirectJudge(
        llm, threshold, model=settings.model, soft_verdicts=settings.soft_verdicts,
        context_budget=settings.context_budget)))
