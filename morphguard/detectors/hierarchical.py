"""Hierarchical verification in the manner of RT4CHART (Yu et al., 2026): claims from each answer sentence,
checked locally against overlapping windows of context sentences, then globally against the whole context.

1. Decompose: the answer is split into sentences; each sentence is split into claims (by the judge, which
   sees the answer but never the context), so every claim keeps its sentence and hence its span.
2. Local: each claim against every window of W context sentences (overlap O); OR-join of the window
   labels: contradicted if any, else entailed if any, else baseless.
3. Global: each claim against the full context, told the local label and the winning window as a hint.
   When the whole context fits in one window the local label is already global and is kept.
4. AND-join to the answer: contradicted if any claim is, else baseless if any is, else entailed.

Evidence is the context sentences (with passage offsets) the verifier cited. A claim's score is the
verifier's probability of "contradicted" or "baseless" when log-probabilities are available, else 1 for
those labels and 0 for "entailed"; the answer's score is the largest claim score.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from morphguard.config import HierarchicalSettings
from morphguard.detectors.judgments import label_probabilities
from morphguard.detectors.meter import Meter
from morphguard.detectors.prompts import as_data, render
from morphguard.detectors.registry import DetectorSpec, register
from morphguard.detectors.replies import json_list, json_object, strings
from morphguard.detectors.spans import locate
from morphguard.detectors.text import sentences
from morphguard.llm.client import Completion, LLMClient, together
from morphguard.models import (
    Cost,
    Detection,
    DetectionStats,
    Evidence,
    Factoid,
    Label,
    RagInput,
)

ENTAILED, CONTRADICTED, BASELESS = "entailed", "contradicted", "baseless"
LABELS = (ENTAILED, CONTRADICTED, BASELESS)
AS_LABEL: dict[str, Label] = {ENTAILED: "supported", CONTRADICTED: "contradicted", BASELESS: "unsupported"}


@dataclass(frozen=True)
class Sentence:
    passage: int  # 1-based
    start: int
    end: int
    text: str


@dataclass
class ClaimJudgment:
    label: str
    evidence: list[int]  # indexes into the context sentences
    probabilities: dict[str, float] | None = None


def windows(count: int, size: int, overlap: int) -> list[range]:
    """Sentence index ranges of the sliding windows covering `count` sentences."""
    if count <= size:
        return [range(count)]
    step = max(1, size - overlap)
    out = []
    for start in range(0, count, step):
        out.append(range(start, min(start + size, count)))
        if start + size >= count:
            break
    return out


def or_join(labels: list[str]) -> str:
    return CONTRADICTED if CONTRADICTED in labels else ENTAILED if ENTAILED in labels else BASELESS


def and_join(labels: list[str]) -> str:
    return CONTRADICTED if CONTRADICTED in labels else BASELESS if BASELESS in labels else ENTAILED


class HierarchicalVerifier:
    name = "hierarchical"

    def __init__(self, llm: LLMClient, options: HierarchicalSettings, threshold: float = 0.5) -> None:
        self.llm = llm
        self.options = options
        self.threshold = threshold

    async def detect(self, rag: RagInput, answer: str) -> Detection:
        started = time.perf_counter()
        meter = Meter()
        context = [Sentence(n, s, e, passage[s:e]) for n, passage in enumerate(rag.passages, 1)
                   for s, e in sentences(passage)]
        claims = await meter.run("decompose", lambda: self._decompose(rag.question, answer, meter))
        spans = windows(len(context), self.options.window, self.options.overlap)

        async def verify_claim(claim: str) -> ClaimJudgment:
            local = await together(self._verify(context, w, claim, None, meter) for w in spans)
            label = or_join([v.label for v in local])
            if len(spans) == 1:  # the one window is the whole context: the local label is the global one
                return local[0]
            winner = next(i for i, v in enumerate(local) if v.label == label)
            cited = local[winner].evidence
            hint = (f"An earlier pass over sentences {spans[winner].start + 1}-{spans[winner].stop} found the claim "
                    f"{label}" + (f", citing sentences {', '.join(str(i + 1) for i in cited)}." if cited else "."))
            return await self._verify(context, range(len(context)), claim, hint, meter)

        verdicts = await meter.run("verify",
                                     lambda: together(verify_claim(text) for text, _ in claims))
        factoids = []
        for (text, (s_start, s_end)), verdict in zip(claims, verdicts, strict=True):
            inside = locate(text, answer[s_start:s_end])
            start, end = (s_start + inside[0], s_start + inside[1]) if inside else (s_start, s_end)
            if verdict.probabilities:
                score = verdict.probabilities[CONTRADICTED] + verdict.probabilities[BASELESS]
            else:
                score = 0.0 if verdict.label == ENTAILED else 1.0
            factoids.append(Factoid(
                text=text, start=start, end=end, score=score, label=AS_LABEL[verdict.label],
                evidence=[Evidence(passage=context[i].passage, start=context[i].start, end=context[i].end,
                                   text=context[i].text) for i in verdict.evidence]))
        score = max((f.score for f in factoids), default=0.0)
        return Detection(
            detector=self.name, score=score, threshold=self.threshold, flagged=score >= self.threshold,
            factoids=factoids, cost=Cost.of(meter.stages, time.perf_counter() - started),
            stats=DetectionStats(factoids=len(factoids)),
            settings={**self.options.__dict__, "answer_label": and_join([v.label for v in verdicts]),
                      "windows": len(spans)},
        )

    async def _call(self, meter: Meter, stage: str, messages: list[dict[str, str]],
                    schema: dict[str, Any], logprobs: bool = False) -> Completion:
        reply = await self.llm.complete(messages, model=self.options.model, max_tokens=512, json_schema=schema,
                                        top_logprobs=5 if logprobs else 0)
        return meter.count(stage, reply)

    async def _decompose(self, question: str, answer: str, meter: Meter
                         ) -> list[tuple[str, tuple[int, int]]]:
        """(claim, span of its answer sentence) for every claim of every sentence, in answer order."""
        parts = sentences(answer)
        if self.options.decompose == "sentences":
            return [(answer[s:e], (s, e)) for s, e in parts]
        schema = {"type": "object", "required": ["claims"],
                  "properties": {"claims": {"type": "array", "items": {"type": "string"}, "maxItems": 8}}}

        async def split(span: tuple[int, int]) -> list[tuple[str, tuple[int, int]]]:
            messages = [{"role": "system", "content": render("hier_decompose_system")},
                        {"role": "user", "content": render("hier_decompose_user", question=as_data(question),
                                                           answer=as_data(answer),
                                                           sentence=as_data(answer[span[0]:span[1]]))}]
            reply = await self._call(meter, "decompose", messages, schema)
            found = json_list(reply.text, "claims")
            claims = strings(found) if found is not None else [answer[span[0]:span[1]]]  # unreadable: the sentence
            return [(c, span) for c in claims]

        per_sentence = await together(split(span) for span in parts)
        return [claim for claims in per_sentence for claim in claims]

    async def _verify(self, context: list[Sentence], window: range, claim: str, hint: str | None,
                      meter: Meter) -> ClaimJudgment:
        if not context:
            return ClaimJudgment(BASELESS, [])
        listed = "\n".join(f"[{i + 1}] {as_data(context[i].text)}" for i in window)
        messages = [{"role": "system", "content": render("hier_verify_system")},
                    {"role": "user", "content": render("hier_verify_user", sentences=listed,
                                                       hint=f"\n<hint>\n{hint}\n</hint>\n" if hint else "",
                                                       claim=as_data(claim))}]
        schema = {"type": "object", "required": ["label", "evidence"],
                  "properties": {"label": {"type": "string", "enum": list(LABELS)},
                                 "evidence": {"type": "array", "items": {"type": "integer"}, "maxItems": 6}}}
        reply = await self._call(meter, "verify", messages, schema, logprobs=self.options.soft_verdicts)
        data = json_object(reply.text) or {}
        label = str(data["label"]) if data.get("label") in LABELS else BASELESS
        cited = [n - 1 for n in data.get("evidence", []) if isinstance(n, int) and n - 1 in window] \
            if isinstance(data, dict) and isinstance(data.get("evidence"), list) else []
        probabilities = (label_probabilities(reply.logprobs, "label", LABELS)
                         if self.options.soft_verdicts else None)
        return ClaimJudgment(label, cited if label != BASELESS else [], probabilities)


SPEC = register(DetectorSpec(
    name="hierarchical", settings=HierarchicalSettings,
    build=lambda settings, threshold, llm: HierarchicalVerifier(llm, settings, threshold),
    models=lambda settings: [settings.model],
    prompts=lambda settings: ["hier_decompose_system", "hier_decompose_user", "hier_verify_system",
                              "hier_verify_user"],
    # Verdicts are read from log-probabilities (`logprob_reader`: see metarag._fingerprint). `reply_reader` 2: a
    # decomposition reply without a claims list counts as unreadable (the sentence is the claim), not as no claims.
    fingerprint=lambda settings: {"options": settings.model_dump(), "logprob_reader": 2, "reply_reader": 2}))
