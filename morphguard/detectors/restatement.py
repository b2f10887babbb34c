"""Restatement: the judge looks only where alignment found a copied sentence changed.

`alignment` finds answer sentences that copy a context sentence closely but differ from it in a negation,
a number, a name or a qualifier. Most such differences in faithful answers are rewording ("is not
allowed" for "is prohibited"); in wrong ones they are the error. A small judge cannot find a reversed
claim in a long context, but it can tell whether two short sentences say the same thing. So each changed
copy (the closest first, at most `max_calls`) goes to the judge with its source sentence alone; the
sentence's score is the judge's probability of NO times the closeness of the copy, and the answer's is
the highest. An answer with no changed copy costs no call and scores 0.
"""

from __future__ import annotations

import time

from morphguard.config import RestatementSettings
from morphguard.detectors.alignment import VERSION as ALIGNMENT_VERSION
from morphguard.detectors.alignment import Conflict, conflicts
from morphguard.detectors.judgments import ask_yes_no
from morphguard.detectors.prompts import as_data, render
from morphguard.detectors.registry import DetectorSpec, changed_options, register
from morphguard.lanes import in_thread
from morphguard.llm.client import LLMClient
from morphguard.models import Cost, Detection, DetectionStats, Factoid, RagInput, StageCost


class RestatementJudge:
    name = "restatement"

    def __init__(self, llm: LLMClient, settings: RestatementSettings, threshold: float = 0.5) -> None:
        self.llm = llm
        self.settings = settings
        self.threshold = threshold

    async def _judge(self, conflict: Conflict, answer: str, stage: StageCost) -> float:
        messages = [
            {"role": "system", "content": render("restatement_system")},
            {"role": "user", "content": render("restatement_user", source=as_data(conflict.evidence.text),
                                               restatement=as_data(answer[conflict.start:conflict.end]))},
        ]
        return await ask_yes_no(self.llm, messages, self.settings.model, stage)

    async def detect(self, rag: RagInput, answer: str, found: list[Conflict] | None = None) -> Detection:
        """`found`: the answer's changed copies where the caller has read them already (`grounding.Reading`)."""
        started = time.perf_counter()
        if found is None:
            # Pure Python over the whole context and answer, seconds for a hostile multi-megabyte pair: off the
            # event loop, as in grounding, so that one such request cannot stall the proxy's others.
            found = await in_thread(conflicts, answer, rag.passages, size=rag.size(answer))
        changed = {c.start: c for c in reversed(found)}  # one per sentence
        closest = sorted(changed.values(), key=lambda c: -c.strength)[: self.settings.max_calls]
        stage = StageCost()
        factoids = []
        for conflict in closest:  # one after the other: the embedded judge decodes one request at a time
            score = conflict.strength * await self._judge(conflict, answer, stage)
            factoids.append(Factoid(text=answer[conflict.start:conflict.end], start=conflict.start, end=conflict.end,
                                    score=score, label="contradicted", evidence=[conflict.evidence],
                                    reason=f"the judge reads it as not saying what its source says ({conflict.kind} "
                                           "changed)"))
        score = max((f.score for f in factoids), default=0.0)
        return Detection(
            detector=self.name, score=score, threshold=self.threshold, flagged=score >= self.threshold,
            factoids=factoids, cost=Cost.of({"verify": stage} if closest else {}, time.perf_counter() - started),
            stats=DetectionStats(factoids=len(factoids)),
            settings={"changed_copies": len(changed), "judged": len(closest)},
        )


register(DetectorSpec(
    name="restatement", settings=RestatementSettings, models=lambda settings: [settings.model],
    prompts=lambda settings: ["restatement_system", "restatement_user"],
    fingerprint=lambda settings: {**changed_options(settings), "logprob_reader": 2, "alignment": ALIGNMENT_VERSION},
    build=lambda settings, threshold, llm: RestatementJudge(llm, settings, threshold)))
