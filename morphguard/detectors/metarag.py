"""MetaRAG (Sok, Luz & Haddam, 2025): metamorphic testing of a RAG answer against its context.

decompose the answer into factoids → N synonym and N antonym variants per factoid (given the question)
→ verify each variant against the passages (YES / NO / NOT SURE) → penalty per variant → S_i = mean
→ H = max_i S_i → flagged when H ≥ τ.

Only verification sees the passages: a small model that sees them while splitting or rewording tends
to "correct" the answer and hide the very errors we look for. Two switches go beyond the paper:
`identity` also verifies each factoid as written (scored like a synonym), and `soft_verdicts` scores a
variant by its expected penalty under the verifier's P(YES), P(NO), P(NOT SURE) when log-probabilities
are available.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from morphguard import telemetry
from morphguard.config import MetaRAGSettings
from morphguard.detectors import scoring
from morphguard.detectors.prompts import as_data, render
from morphguard.detectors.spans import align_evidence, locate
from morphguard.detectors.verdicts import parse_verdict, verdict_probabilities
from morphguard.llm.client import Completion, LLMClient
from morphguard.models import (
    Cost,
    Detection,
    DetectionStats,
    Factoid,
    Label,
    RagInput,
    StageCost,
    Variant,
    VariantKind,
    Verdict,
)
from morphguard.telemetry import names

T = TypeVar("T")


@dataclass(frozen=True)
class MetaRAGOptions:
    n_mutations: int = 2  # N: synonyms and antonyms per factoid, each
    mutation_temperature: float = 0.0
    decompose_model: str | None = None  # None: the judge's default model
    mutate_model: str | None = None
    verify_models: tuple[str | None, ...] = (None,)  # several: the "multi" ensemble, penalties averaged
    identity: bool = False
    soft_verdicts: bool = False
    reasons: bool = True  # ask each verification for a one-line reason
    max_factoids: int = 32


PROFILES: dict[str, MetaRAGOptions] = {
    # As published: N = 2 per relation, discrete verdicts, temperature 0.
    "paper": MetaRAGOptions(),
    # For the 1.5B embedded judge, where measured variants drift and verdicts are noisy: verify each factoid
    # as written with soft scores and one variant per relation. No reasons: the verdict is written first, so a
    # reason never changes the score, yet reasons were most of the generated tokens (one RAGTruth Data2txt
    # answer: 2,012 output tokens over 51 calls, 184 of its 253 s in verify).
    "embedded": MetaRAGOptions(n_mutations=1, identity=True, soft_verdicts=True, reasons=False, max_factoids=16),
}


def resolve_options(settings: MetaRAGSettings) -> MetaRAGOptions:
    """The named profile with every field the config sets explicitly laid over it."""
    options = PROFILES[settings.profile]
    overrides: dict[str, Any] = {
        k: v for k, v in settings.model_dump(exclude={"profile"}).items() if v is not None
    }
    if "verify_models" in overrides:
        overrides["verify_models"] = tuple(overrides["verify_models"]) or (None,)
    return replace(options, **overrides)


@dataclass
class _Meter:
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
                span.set_attribute(names.OUTPUT_TOKENS, cost.output_tokens)

    def count(self, stage: str, completion: Completion) -> Completion:
        cost = self.stages.setdefault(stage, StageCost())
        if completion.cached:
            cost.cached_calls += 1
        else:
            cost.llm_calls += 1
            cost.input_tokens += completion.input_tokens
            cost.output_tokens += completion.output_tokens
        return completion

    def total(self, seconds: float) -> Cost:
        return Cost(
            llm_calls=sum(s.llm_calls for s in self.stages.values()),
            cached_calls=sum(s.cached_calls for s in self.stages.values()),
            input_tokens=sum(s.input_tokens for s in self.stages.values()),
            output_tokens=sum(s.output_tokens for s in self.stages.values()),
            seconds=seconds,
            stages=self.stages,
        )


_STRING_LIST = {"type": "array", "items": {"type": "string"}}


class MetaRAG:
    name = "metarag"

    def __init__(self, llm: LLMClient, options: MetaRAGOptions, threshold: float = 0.5) -> None:
        self.llm = llm
        self.options = options
        self.threshold = threshold

    async def detect(self, rag: RagInput, answer: str) -> Detection:
        started = time.perf_counter()
        meter = _Meter()
        stats = DetectionStats()

        statements = await meter.run("decompose", lambda: self._decompose(rag.question, answer, meter))
        statements = statements[: self.options.max_factoids]
        mutations = await meter.run(
            "mutate", lambda: asyncio.gather(*(self._variants_of(rag.question, s, meter, stats) for s in statements))
        )
        passages = "\n\n".join(f"[{i}] {as_data(p)}" for i, p in enumerate(rag.passages, 1))
        verified = await meter.run(
            "verify",
            lambda: asyncio.gather(*(asyncio.gather(*(self._verify(passages, kind, text, meter) for kind, text in variants))
                             for variants in mutations)),
        )

        factoids = []
        for statement, variants in zip(statements, verified):
            flat = [v for per_model in variants for v in per_model]
            stats.unparseable_verdicts += sum(not v.parsed for v in flat)
            span = locate(statement, answer)
            score = scoring.factoid_score(v.penalty for v in flat)
            label = _label(flat, score, self.threshold)
            evidence = align_evidence(statement, rag.passages) if label != "unsupported" else None
            factoids.append(Factoid(
                text=statement,
                start=span[0] if span else None,
                end=span[1] if span else None,
                score=score,
                label=label,
                evidence=[evidence] if evidence else [],
                variants=flat,
            ))
        stats.factoids = len(factoids)
        stats.variants = sum(len(f.variants) for f in factoids)
        score = scoring.response_score(f.score for f in factoids)
        return Detection(
            detector=self.name,
            score=score,
            threshold=self.threshold,
            flagged=scoring.is_flagged(score, self.threshold),
            factoids=factoids,
            cost=meter.total(time.perf_counter() - started),
            stats=stats,
            settings={k: v for k, v in self.options.__dict__.items()},
        )

    async def _decompose(self, question: str, answer: str, meter: _Meter) -> list[str]:
        if not answer.strip():
            return []
        messages = [
            {"role": "system", "content": render("decompose_system")},
            {"role": "user", "content": render("decompose_user", question=as_data(question), answer=as_data(answer))},
        ]
        schema = {"type": "object", "properties": {"factoids": {**_STRING_LIST, "maxItems": self.options.max_factoids}},
                  "required": ["factoids"]}
        reply = meter.count("decompose", await self.llm.complete(
            messages, model=self.options.decompose_model, max_tokens=1024, json_schema=schema))
        factoids = _string_list(reply.text, "factoids")
        if factoids is None:  # unreadable: fall back to the answer's own sentences
            factoids = [s.strip() for s in re.split(r"(?<=[.!?])\s+", answer) if s.strip()]
        return _unique(factoids)

    async def _variants_of(self, question: str, factoid: str, meter: _Meter,
                           stats: DetectionStats) -> list[tuple[VariantKind, str]]:
        variants: list[tuple[VariantKind, str]] = []
        if self.options.identity:
            variants.append((VariantKind.IDENTITY, factoid))
        n = self.options.n_mutations
        if n > 0:
            synonyms, antonyms = await asyncio.gather(
                self._mutate("synonym_system", question, factoid, n, meter, stats),
                self._mutate("antonym_system", question, factoid, n, meter, stats),
            )
            variants += [(VariantKind.SYNONYM, s) for s in synonyms]
            variants += [(VariantKind.ANTONYM, a) for a in antonyms]
        if not variants:  # every mutation failed: judge the factoid itself rather than nothing
            variants.append((VariantKind.IDENTITY, factoid))
        return variants

    async def _mutate(self, prompt: str, question: str, factoid: str, n: int, meter: _Meter,
                      stats: DetectionStats) -> list[str]:
        messages = [
            {"role": "system", "content": render(prompt, n=n)},
            {"role": "user", "content": render("mutate_user", question=as_data(question), factoid=as_data(factoid))},
        ]
        schema = {"type": "object",
                  "properties": {"statements": {**_STRING_LIST, "minItems": n, "maxItems": n}},
                  "required": ["statements"]}
        reply = meter.count("mutate", await self.llm.complete(
            messages, model=self.options.mutate_model, temperature=self.options.mutation_temperature,
            max_tokens=96 * n, json_schema=schema))
        statements = _string_list(reply.text, "statements")
        if statements is None:
            stats.unparseable_mutations += 1
            return []
        return _unique(statements)[:n]

    async def _verify(self, passages: str, kind: VariantKind, statement: str, meter: _Meter) -> list[Variant]:
        return list(await asyncio.gather(
            *(self._verify_with(model, passages, kind, statement, meter) for model in self.options.verify_models)))

    async def _verify_with(self, model: str | None, passages: str, kind: VariantKind, statement: str,
                           meter: _Meter) -> Variant:
        reasons = self.options.reasons
        # Passages first, statement last: every verify call of one answer shares the same prompt prefix,
        # which llama.cpp (and API prompt caches) compute once.
        messages = [
            {"role": "system", "content": render("verify_system",
                                                 reason_field=', "reason": "<one short sentence>"' if reasons else "")},
            {"role": "user", "content": render("verify_user", passages=passages, statement=as_data(statement))},
        ]
        properties: dict[str, Any] = {"verdict": {"type": "string", "enum": [v.value for v in Verdict]}}
        if reasons:
            properties["reason"] = {"type": "string", "maxLength": 200}
        schema = {"type": "object", "properties": properties, "required": list(properties)}
        reply = meter.count("verify", await self.llm.complete(
            messages, model=model, max_tokens=80 if reasons else 16, json_schema=schema,
            top_logprobs=5 if self.options.soft_verdicts else 0))
        parsed = parse_verdict(reply.text)
        probabilities = verdict_probabilities(reply.text, reply.logprobs) if self.options.soft_verdicts else None
        if probabilities and parsed.parsed:
            penalty = scoring.expected_penalty(kind, probabilities)
        else:
            penalty = scoring.penalty(kind, parsed.verdict)
        return Variant(
            kind=kind,
            text=statement,
            verdict=parsed.verdict,
            reason=parsed.reason,
            penalty=penalty,
            probabilities={v.value: round(p, 4) for v, p in probabilities.items()} if probabilities else None,
            verifier=reply.model,
            parsed=parsed.parsed,
        )


def _label(variants: list[Variant], score: float, threshold: float) -> Label:
    """Supported below the threshold; above it, contradicted when the verifier's refutations outweigh its
    doubts (NO for the factoid or its synonyms, YES for its antonyms), else unsupported."""
    if score < threshold:
        return "supported"
    refuted = doubted = 0.0
    for v in variants:
        p = v.probabilities or {v.verdict.value: 1.0}
        against = Verdict.YES.value if v.kind is VariantKind.ANTONYM else Verdict.NO.value
        refuted += p.get(against, 0.0)
        doubted += p.get(Verdict.NOT_SURE.value, 0.0)
    return "contradicted" if refuted >= doubted else "unsupported"


def _string_list(text: str, key: str) -> list[str] | None:
    """The list of strings under `key` in a JSON reply (or a bare JSON list); None when unreadable."""
    try:
        data = json.loads(text)
    except ValueError:
        match = re.search(r"\[.*\]", text, re.S)
        try:
            data = json.loads(match.group(0)) if match else None
        except ValueError:
            data = None
    if isinstance(data, dict):
        data = data.get(key)
    if not isinstance(data, list):
        return None
    return [s.strip() for s in data if isinstance(s, str) and s.strip()]


def _unique(items: list[str]) -> list[str]:
    seen: set[str] = set()
    return [s for s in items if not (s.lower() in seen or seen.add(s.lower()))]  # type: ignore[func-returns-value]
