"""The one-call claim judge: the answer's atomic claims, each labelled supported / unsupported /
contradicted against the passages, with a verbatim evidence phrase for each supported claim.

Guards against the judge's known failure modes:
- a "supported" claim whose evidence phrase is not in the passages is downgraded to unsupported
  (the judge may vouch from its own knowledge);
- compound claims ("X and Y") are re-asked once with a sharper instruction;
- `samples` > 1 asks k times at a non-zero temperature and keeps the majority answer-level verdict;
- passages longer than `max_context_chars` in total are judged one at a time (claims extracted once,
  then labelled per passage and joined: contradicted if any passage contradicts, else supported if any
  supports, else unsupported).

Score: the largest claim score (1 for unsupported or contradicted, 0 for supported), or with
`aggregate: rate` the share of claims not supported.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

from morphguard.config import ClaimsSettings
from morphguard.detectors.prompts import as_data, numbered, render
from morphguard.detectors.registry import DetectorSpec, register
from morphguard.detectors.replies import json_list
from morphguard.detectors.spans import find_phrase, locate
from morphguard.llm.client import Completion, LLMClient, together
from morphguard.models import (
    Cost,
    Detection,
    DetectionStats,
    Evidence,
    Factoid,
    Label,
    RagInput,
    StageCost,
)

LABELS: tuple[Label, ...] = ("supported", "unsupported", "contradicted")
_COMPOUND = re.compile(r";|,? (?:and|but|while|whereas) (?:it |they |he |she |the |this |that )?\w+(?:s|ed)\b", re.I)
_ATOMIC = ("\nYour last split left claims that join several facts. Every claim must state exactly one fact: "
           "split at every 'and', 'but' or ';' that joins two facts.\n")


@dataclass
class _Claim:
    text: str
    label: Label
    evidence: Evidence | None = None
    downgraded: bool = False


class ClaimJudge:
    name = "claims"

    def __init__(self, llm: LLMClient, options: ClaimsSettings, threshold: float = 0.5) -> None:
        self.llm = llm
        self.options = options
        self.threshold = threshold

    async def detect(self, rag: RagInput, answer: str) -> Detection:
        started = time.perf_counter()
        cost = StageCost()
        if not answer.strip():
            return self._detection([], cost, started)
        if sum(len(p) for p in rag.passages) > self.options.max_context_chars:
            claims = await self._per_passage(rag, answer, cost)
        elif self.options.samples > 1:
            runs = await together(self._judge(rag, answer, cost, self.options.sample_temperature)
                                  for _ in range(self.options.samples))
            claims = _majority(runs, self.options.aggregate)
        else:
            claims = await self._judge(rag, answer, cost, 0.0)
        factoids = []
        for claim in claims:
            span = locate(claim.text, answer)
            factoids.append(Factoid(text=claim.text, start=span[0] if span else None, end=span[1] if span else None,
                                    score=0.0 if claim.label == "supported" else 1.0, label=claim.label,
                                    evidence=[claim.evidence] if claim.evidence else []))
        detection = self._detection(factoids, cost, started)
        detection.stats.downgraded_claims = sum(c.downgraded for c in claims)
        return detection

    def _detection(self, factoids: list[Factoid], cost: StageCost, started: float) -> Detection:
        scores = [f.score for f in factoids]
        if not scores:
            score = 0.0
        elif self.options.aggregate == "rate":
            score = sum(scores) / len(scores)
        else:
            score = max(scores)
        cost.seconds = time.perf_counter() - started
        return Detection(
            detector=self.name, score=score, threshold=self.threshold, flagged=score >= self.threshold,
            factoids=factoids, cost=Cost.of({"verify": cost}, cost.seconds),
            stats=DetectionStats(factoids=len(factoids)), settings=dict(self.options.__dict__),
        )

    async def _call(self, messages: list[dict[str, str]], schema: dict[str, Any], cost: StageCost,
                    temperature: float = 0.0) -> Completion:
        reply = await self.llm.complete(messages, model=self.options.model, temperature=temperature,
                                        max_tokens=1024, json_schema=schema)
        cost.count(reply)
        return reply

    async def _judge(self, rag: RagInput, answer: str, cost: StageCost, temperature: float) -> list[_Claim]:
        passages = numbered(rag.passages)
        user = render("direct_user", passages=passages, question=as_data(rag.question), answer=as_data(answer))
        schema = {"type": "object", "required": ["claims"], "properties": {"claims": {"type": "array", "items": {
            "type": "object", "required": ["text", "label", "evidence"],
            "properties": {"text": {"type": "string"}, "label": {"type": "string", "enum": list(LABELS)},
                           "evidence": {"type": "string"}}}}}}
        claims: list[_Claim] = []
        for atomic in ("", _ATOMIC) if self.options.resplit_compound else ("",):
            messages = [{"role": "system", "content": render("claims_system", atomic=atomic)},
                        {"role": "user", "content": user}]
            reply = await self._call(messages, schema, cost, temperature)
            listed = json_list(reply.text, "claims") or []
            claims = [c for c in (self._checked(item, rag.passages) for item in listed) if c.text]
            if not any(_COMPOUND.search(c.text) for c in claims):
                break
        return claims

    async def _per_passage(self, rag: RagInput, answer: str, cost: StageCost) -> list[_Claim]:
        messages = [{"role": "system", "content": render("claims_extract_system")},
                    {"role": "user", "content": render("decompose_user", question=as_data(rag.question),
                                                       answer=as_data(answer))}]
        schema = {"type": "object", "required": ["claims"],
                  "properties": {"claims": {"type": "array", "items": {"type": "string"}}}}
        reply = await self._call(messages, schema, cost)
        texts = [t.strip() for t in (json_list(reply.text, "claims") or []) if isinstance(t, str) and t.strip()]
        if not texts:
            return []
        listed = "\n".join(f"{i}. {as_data(t)}" for i, t in enumerate(texts, 1))
        schema = {"type": "object", "required": ["labels"], "properties": {"labels": {
            "type": "array", "minItems": len(texts), "maxItems": len(texts), "items": {
                "type": "object", "required": ["label", "evidence"],
                "properties": {"label": {"type": "string", "enum": list(LABELS)}, "evidence": {"type": "string"}}}}}}

        async def label(passage: str) -> list[_Claim]:
            messages = [{"role": "system", "content": render("claims_label_system")},
                        {"role": "user", "content": render("claims_label_user", passages=numbered([passage]),
                                                           claims=listed)}]
            labels = json_list((await self._call(messages, schema, cost)).text, "labels") or []
            return [self._checked({"text": t, **(labels[i] if i < len(labels) and isinstance(labels[i], dict) else {})},
                                  [passage]) for i, t in enumerate(texts)]

        per_passage = await together(label(p) for p in rag.passages)
        joined = []
        for i, text in enumerate(texts):
            verdicts = [(n, claims[i]) for n, claims in enumerate(per_passage, 1)]
            for wanted in ("contradicted", "supported"):
                hit = next(((n, c) for n, c in verdicts if c.label == wanted), None)
                if hit:
                    n, claim = hit
                    evidence = claim.evidence.model_copy(update={"passage": n}) if claim.evidence else None
                    joined.append(_Claim(text, wanted, evidence))
                    break
            else:
                joined.append(_Claim(text, "unsupported", downgraded=any(c.downgraded for _, c in verdicts)))
        return joined

    @staticmethod
    def _checked(item: Any, passages: list[str]) -> _Claim:
        """A claim from the reply, with its evidence located in the passages or the label downgraded."""
        if not isinstance(item, dict) or not str(item.get("text", "")).strip():
            return _Claim("", "unsupported")
        text = str(item["text"]).strip()
        label = item.get("label") if item.get("label") in LABELS else "unsupported"
        phrase = str(item.get("evidence") or "").strip()
        evidence = find_phrase(phrase, passages) if phrase else None
        if label == "supported" and evidence is None:
            return _Claim(text, "unsupported", downgraded=True)
        return _Claim(text, label, evidence)  # type: ignore[arg-type]


def _majority(runs: list[list[_Claim]], aggregate: str) -> list[_Claim]:
    """The run whose answer-level verdict agrees with the majority (ties: flagged), the median one among those."""
    def bad(claims: list[_Claim]) -> float:
        scores = [0.0 if c.label == "supported" else 1.0 for c in claims if c.text]
        if not scores:
            return 0.0
        return sum(scores) / len(scores) if aggregate == "rate" else max(scores)

    flagged = [bad(r) > 0 for r in runs]
    majority = sum(flagged) * 2 >= len(runs)
    agreeing = sorted((r for r, f in zip(runs, flagged, strict=True) if f == majority), key=bad)
    return [c for c in agreeing[len(agreeing) // 2] if c.text] if agreeing else []


SPEC = register(DetectorSpec(
    name="claims", settings=ClaimsSettings,
    build=lambda settings, threshold, llm: ClaimJudge(llm, settings, threshold),
    models=lambda settings: [settings.model],
    prompts=lambda settings: ["claims_system", "direct_user", "claims_extract_system", "decompose_user",
                              "claims_label_system", "claims_label_user"]))
