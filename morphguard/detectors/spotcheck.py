"""Spot check: the judge reads the answer sentence that grounding trusts least, beside the context it is about.

Grounding counts the content words the context never uses. In a faithful answer most of them are
rewording; in a hallucinated one some are the invention, and counting cannot tell which. A small judge
asked about a whole answer against a whole context waves most of it through, but it reads one sentence
beside a few context sentences well enough. So the answer sentences with the most unsupported weight
(numbers and names weighing more, as in grounding; at most `max_calls`, the worst first) each go to the
judge with the context cut to the sentences most relevant to it (`focus`). A sentence's score is the
judge's probability of NO, the answer's the highest. Sentences that state nothing ("Here is a summary in
60 words:") are never judged.

An answer whose content words the context all uses still gets one call, on its sentence with the most content
words: a negated claim or a name moved from elsewhere in the context is made of the context's words, and such
an answer is usually short, so one sentence is most of it. Scoring such an answer 0 without a call would leave the
combined check's first stage, which reads the spot check and not `direct`, with no judge's word on it at all.
"""

from __future__ import annotations

import time

from morphguard.config import SpotCheckSettings
from morphguard.detectors.focus import focus
from morphguard.detectors.grounding import VERSION as GROUNDING_VERSION
from morphguard.detectors.grounding import Grounding, GroundingSettings, SentenceReport, ungrounded
from morphguard.detectors.judgments import ask_yes_no
from morphguard.detectors.prompts import as_data, numbered, render
from morphguard.detectors.registry import DetectorSpec, changed_options, register
from morphguard.detectors.text import statements
from morphguard.lanes import in_thread
from morphguard.llm.client import LLMClient
from morphguard.models import Cost, Detection, DetectionStats, Factoid, RagInput, StageCost

PLAN_VERSION = 2  # of `SpotCheck.plan`'s choice of sentences: a change makes earlier eval results stale


class SpotCheck:
    name = "spotcheck"

    def __init__(self, llm: LLMClient, settings: SpotCheckSettings, threshold: float = 0.5) -> None:
        self.llm = llm
        self.settings = settings
        self.threshold = threshold
        self.grounding = Grounding(GroundingSettings())

    def plan(self, rag: RagInput, answer: str,
             reports: list[SentenceReport] | None = None) -> list[tuple[int, int, str]]:
        """The sentences to judge, each with the context cut for it: those with unsupported words that state
        something, the most unsupported weight first; where there are none, the stating sentence with the most
        content words. `reports`: the answer's `ungrounded` sentences where the caller has read them already."""
        if reports is None:
            reports = ungrounded(answer, rag.passages, rag.question)
        stating = [r for r in reports if statements(answer[r.start:r.end])]
        candidates = [(self.grounding.weight(r.unsupported), r.start, r.end) for r in stating if r.unsupported]
        candidates.sort(key=lambda c: (-c[0], c[1]))
        chosen = [(start, end) for _, start, end in candidates[: self.settings.max_calls]]
        if not chosen and stating:
            fullest = max(stating, key=lambda r: (r.content, -r.start))
            chosen = [(fullest.start, fullest.end)]
        return [(start, end, numbered(focus([answer[start:end]], rag.passages, self.settings.context_budget)))
                for start, end in chosen]

    async def _judge(self, sentence: str, passages: str, stage: StageCost) -> float:
        messages = [
            {"role": "system", "content": render("spotcheck_system")},
            {"role": "user", "content": render("spotcheck_user", passages=passages, sentence=as_data(sentence))},
        ]
        return await ask_yes_no(self.llm, messages, self.settings.model, stage)

    async def detect(self, rag: RagInput, answer: str, reports: list[SentenceReport] | None = None) -> Detection:
        """`reports`: the answer's `ungrounded` sentences where the caller has read them already
        (`grounding.Reading`)."""
        started = time.perf_counter()
        # Pure Python over the whole context, seconds for a hostile multi-megabyte one: off the event loop, so that
        # one such request cannot stall the proxy's others (as in grounding).
        chosen = await in_thread(self.plan, rag, answer, reports, size=rag.size(answer))
        stage = StageCost()
        factoids = []
        for start, end, passages in chosen:  # one after the other: the embedded judge decodes one request at a time
            score = await self._judge(answer[start:end], passages, stage)
            factoids.append(Factoid(text=answer[start:end], start=start, end=end, score=score, label="unsupported",
                                    reason="the judge finds it stated nowhere in the context"))
        score = max((f.score for f in factoids), default=0.0)
        return Detection(
            detector=self.name, score=score, threshold=self.threshold, flagged=score >= self.threshold,
            factoids=factoids, cost=Cost.of({"verify": stage} if chosen else {}, time.perf_counter() - started),
            stats=DetectionStats(factoids=len(factoids)),
            settings={"judged": len(chosen)},
        )


register(DetectorSpec(
    name="spotcheck", settings=SpotCheckSettings, models=lambda settings: [settings.model],
    prompts=lambda settings: ["spotcheck_system", "spotcheck_user"],
    fingerprint=lambda settings: {**changed_options(settings), "logprob_reader": 2, "grounding": GROUNDING_VERSION,
                                  "plan": PLAN_VERSION},
    build=lambda settings, threshold, llm: SpotCheck(llm, settings, threshold)))
