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

import hashlib
import json
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable
from dataclasses import asdict, dataclass, replace
from typing import Any, TypeVar

from morphguard.config import MetaRAGSettings
from morphguard.detectors import focus, scoring, text
from morphguard.detectors.judgments import (
    ParsedJudgment,
    judgment_probabilities,
    parse_judgment,
)
from morphguard.detectors.meter import Meter
from morphguard.detectors.prompts import as_data, numbered, render
from morphguard.detectors.registry import DetectorSpec, register
from morphguard.detectors.relations import negate
from morphguard.detectors.replies import json_list, strings
from morphguard.detectors.spans import align_evidence, locate
from morphguard.llm.client import LLMClient, together
from morphguard.models import (
    Cost,
    Detection,
    DetectionStats,
    Factoid,
    Judgment,
    Label,
    RagInput,
    Variant,
    VariantKind,
)

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
    batch_mutations: bool = False  # all variants of all factoids in one structured call
    batch_verify: str = "none"  # none: one call per variant | factoid: per factoid | all: one call
    rule_antonyms: bool = False  # a number or polarity rule makes the antonym where it applies (no call)
    verdict_cache: int = 4096  # (statement, passages, verifier) → verdict, LRU within and across checks; 0: off
    decompose: str = "llm"  # llm: factoids from the judge | sentences: the answer's own statements, no call
    context_budget: int = 0  # characters of context verified: the most relevant sentences (focus.py); 0: all


PROFILES: dict[str, MetaRAGOptions] = {
    # As published: N = 2 per relation, discrete verdicts, temperature 0.
    "paper": MetaRAGOptions(),
    # The default for the 1.5B embedded judge, built for inline latency. Measured there (evaluation log, 2026-11-22),
    # generation and then reading are the cost, and antonyms, by rule or by the judge, lowered AUROC: the judge
    # says YES to a statement and to its negation alike. So one call: the answer's own sentences are the
    # factoids, each verified as written against the context sentences that share words with the answer,
    # every verdict scored softly from its token's log-probabilities.
    "embedded": MetaRAGOptions(n_mutations=0, identity=True, soft_verdicts=True, reasons=False, max_factoids=16,
                               decompose="sentences", batch_verify="all", context_budget=1000),
    # For API judges, where the context repeated in every verify call is the cost: the paper's N = 2, with
    # all mutations in one call and all verifications in one call.
    "batched": MetaRAGOptions(reasons=False, batch_mutations=True, batch_verify="all"),
    # The judge splits the answer into factoids and verifies each one as written, one call per factoid,
    # against the whole context, scored softly: no mutations, which the small judge cannot use (it says YES
    # to a statement and to its negation alike), but each claim judged on its own.
    "factoids": MetaRAGOptions(n_mutations=0, identity=True, soft_verdicts=True, reasons=False, max_factoids=12),
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


_STRING_LIST = {"type": "array", "items": {"type": "string"}}


class MetaRAG:
    name = "metarag"

    def __init__(self, llm: LLMClient, options: MetaRAGOptions, threshold: float = 0.5) -> None:
        self.llm = llm
        self.options = options
        self.threshold = threshold
        self._verdicts: OrderedDict[str, tuple[ParsedJudgment, dict[Judgment, float] | None, str]] = OrderedDict()

    async def detect(self, rag: RagInput, answer: str) -> Detection:
        started = time.perf_counter()
        meter = Meter()
        stats = DetectionStats()

        if self.options.decompose == "sentences":
            statements = text.statements(answer, self.options.max_factoids)
        else:
            statements = await meter.run("decompose", lambda: self._decompose(rag.question, answer, meter))
        statements = statements[: self.options.max_factoids]
        def variants_of() -> Awaitable[list[list[tuple[VariantKind, str]]]]:
            return together(self._variants_of(rag.question, s, meter, stats) for s in statements)

        if self.options.n_mutations == 0:  # the factoid itself and rule antonyms: no call, no stage
            mutations = await variants_of()
        elif self.options.batch_mutations:
            mutations = await meter.run(
                "mutate", lambda: self._variants_batched(rag.question, statements, meter, stats))
        else:
            mutations = await meter.run("mutate", variants_of)
        focused = focus.focus(statements, rag.passages, self.options.context_budget)
        passages = numbered(focused)
        verified = await meter.run("verify", lambda: self._verify_all(passages, mutations, meter))

        factoids = []
        for statement, variants in zip(statements, verified, strict=True):
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
                reason=_explanation(flat),
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
            cost=Cost.of(meter.stages, time.perf_counter() - started),
            stats=stats,
            settings={k: v for k, v in self.options.__dict__.items()},
        )

    async def _decompose(self, question: str, answer: str, meter: Meter) -> list[str]:
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
        factoids = _strings_or_none(reply.text, "factoids")
        if factoids is None:  # unreadable: fall back to the answer's own sentences
            factoids = [s.strip() for s in re.split(r"(?<=[.!?])\s+", answer) if s.strip()]
        return _unique(factoids)

    async def _variants_of(self, question: str, factoid: str, meter: Meter,
                           stats: DetectionStats) -> list[tuple[VariantKind, str]]:
        variants: list[tuple[VariantKind, str]] = []
        if self.options.identity:
            variants.append((VariantKind.IDENTITY, factoid))
        n = self.options.n_mutations
        ruled = negate(factoid) if self.options.rule_antonyms else None
        def by_judge(prompt: str) -> Awaitable[list[str]]:
            return self._mutate(prompt, question, factoid, n, meter, stats) if n else _just([])

        synonyms, antonyms = await together(
            (by_judge("synonym_system"), _just([ruled]) if ruled else by_judge("antonym_system")))
        variants += [(VariantKind.SYNONYM, s) for s in synonyms]
        variants += [(VariantKind.ANTONYM, a) for a in antonyms]
        if not variants:  # every mutation failed: judge the factoid itself rather than nothing
            variants.append((VariantKind.IDENTITY, factoid))
        return variants

    async def _variants_batched(self, question: str, factoids: list[str], meter: Meter,
                                stats: DetectionStats) -> list[list[tuple[VariantKind, str]]]:
        """Synonyms and antonyms of every factoid from one structured call."""
        if not factoids:
            return []
        n = self.options.n_mutations
        listed = "\n".join(f"{i}. {as_data(f)}" for i, f in enumerate(factoids, 1))
        messages = [
            {"role": "system", "content": render("mutate_batch_system", n=n)},
            {"role": "user", "content": render("mutate_batch_user", question=as_data(question), statements=listed)},
        ]
        variant_list = {**_STRING_LIST, "minItems": n, "maxItems": n}
        schema = {"type": "object", "required": ["items"], "properties": {"items": {
            "type": "array", "minItems": len(factoids), "maxItems": len(factoids),
            "items": {"type": "object", "required": ["synonyms", "antonyms"],
                      "properties": {"synonyms": variant_list, "antonyms": variant_list}}}}}
        reply = meter.count("mutate", await self.llm.complete(
            messages, model=self.options.mutate_model, temperature=self.options.mutation_temperature,
            max_tokens=min(4096, 80 * n * 2 * len(factoids) + 64), json_schema=schema))
        items = json_list(reply.text, "items") or []
        out = []
        for i, factoid in enumerate(factoids):
            item = items[i] if i < len(items) and isinstance(items[i], dict) else {}
            synonyms = _unique([x.strip() for x in item.get("synonyms") or [] if isinstance(x, str) and x.strip()])[:n]
            ruled = negate(factoid) if self.options.rule_antonyms else None
            antonyms = [ruled] if ruled else _unique(
                [x.strip() for x in item.get("antonyms") or [] if isinstance(x, str) and x.strip()])[:n]
            if not item:
                stats.unparseable_mutations += 1
            variants = [(VariantKind.IDENTITY, factoid)] if self.options.identity else []
            variants += [(VariantKind.SYNONYM, x) for x in synonyms] + [(VariantKind.ANTONYM, x) for x in antonyms]
            out.append(variants or [(VariantKind.IDENTITY, factoid)])
        return out

    async def _mutate(self, prompt: str, question: str, factoid: str, n: int, meter: Meter,
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
        statements = _strings_or_none(reply.text, "statements")
        if statements is None:
            stats.unparseable_mutations += 1
            return []
        return _unique(statements)[:n]

    async def _verify_all(self, passages: str, mutations: list[list[tuple[VariantKind, str]]],
                          meter: Meter) -> list[list[list[Variant]]]:
        """verified[factoid][variant] = one Variant per verifier model, by the configured batching."""
        mode = self.options.batch_verify
        if mode == "none":
            return await together(together(self._verify(passages, kind, text, meter) for kind, text in variants)
                                  for variants in mutations)
        groups = mutations if mode == "factoid" else [[v for variants in mutations for v in variants]]
        per_model = await together(
            together(self._verify_batch(model, passages, group, meter) for group in groups)
            for model in self.options.verify_models)
        # per_model[model][group][i] → back to [factoid][variant][model]
        flat_by_model = [[v for group in groups_out for v in group] for groups_out in per_model]
        out, cursor = [], 0
        for variants in mutations:
            out.append([[flat[cursor + j] for flat in flat_by_model] for j in range(len(variants))])
            cursor += len(variants)
        return out

    async def _verify_batch(self, model: str | None, passages: str, items: list[tuple[VariantKind, str]],
                            meter: Meter) -> list[Variant]:
        """Several statements verified in one call; cached verdicts are reused and not asked again."""
        results: list[Variant | None] = [self._cached(model, passages, kind, text, meter) for kind, text in items]
        todo = [i for i, r in enumerate(results) if r is None]
        if todo:
            listed = "\n".join(f"{n}. {as_data(items[i][1])}" for n, i in enumerate(todo, 1))
            messages = [
                {"role": "system", "content": render("verify_batch_system")},
                {"role": "user", "content": render("verify_batch_user", passages=passages, statements=listed)},
            ]
            schema = {"type": "object", "required": ["verdicts"], "properties": {"verdicts": {
                "type": "array", "minItems": len(todo), "maxItems": len(todo),
                "items": {"type": "string", "enum": [v.value for v in Judgment]}}}}
            reply = meter.count("verify", await self.llm.complete(
                messages, model=model, max_tokens=16 * len(todo) + 32, json_schema=schema,
                top_logprobs=5 if self.options.soft_verdicts else 0))
            verdicts = json_list(reply.text, "verdicts") or []
            for n, i in enumerate(todo):
                raw = json.dumps({"verdict": verdicts[n]}) if n < len(verdicts) else ""
                probabilities = (judgment_probabilities(reply.logprobs, occurrence=n, listed=True)
                                 if self.options.soft_verdicts and n < len(verdicts) else None)
                results[i] = self._scored(model, passages, items[i][0], items[i][1], parse_judgment(raw),
                                          probabilities, reply.model)
        return [r for r in results if r is not None]

    def _cached(self, model: str | None, passages: str, kind: VariantKind, statement: str,
                meter: Meter) -> Variant | None:
        key = _cache_key(model, passages, statement, self.options.soft_verdicts)
        hit = self._verdicts.get(key)
        if hit is None:
            return None
        self._verdicts.move_to_end(key)
        meter.hit("verify")
        parsed, probabilities, verifier = hit
        return self._variant(kind, statement, parsed, probabilities, verifier)

    def _scored(self, model: str | None, passages: str, kind: VariantKind, statement: str, parsed: ParsedJudgment,
                probabilities: dict[Judgment, float] | None, verifier: str) -> Variant:
        if self.options.verdict_cache and parsed.parsed:
            self._verdicts[_cache_key(model, passages, statement, self.options.soft_verdicts)] = (
                parsed, probabilities, verifier)
            while len(self._verdicts) > self.options.verdict_cache:
                self._verdicts.popitem(last=False)
        return self._variant(kind, statement, parsed, probabilities, verifier)

    @staticmethod
    def _variant(kind: VariantKind, statement: str, parsed: ParsedJudgment,
                 probabilities: dict[Judgment, float] | None, verifier: str) -> Variant:
        if probabilities and parsed.parsed:
            penalty = scoring.expected_penalty(kind, probabilities)
        else:
            penalty = scoring.penalty(kind, parsed.judgment)
        return Variant(kind=kind, text=statement, verdict=parsed.judgment, reason=parsed.reason, penalty=penalty,
                       probabilities=({v.value: round(p, 4) for v, p in probabilities.items()}
                                      if probabilities else None),
                       verifier=verifier, parsed=parsed.parsed)

    async def _verify(self, passages: str, kind: VariantKind, statement: str, meter: Meter) -> list[Variant]:
        return await together(
            self._verify_with(model, passages, kind, statement, meter) for model in self.options.verify_models)

    async def _verify_with(self, model: str | None, passages: str, kind: VariantKind, statement: str,
                           meter: Meter) -> Variant:
        cached = self._cached(model, passages, kind, statement, meter)
        if cached is not None:
            return cached
        reasons = self.options.reasons
        # Passages first, statement last: every verify call of one answer shares the same prompt prefix,
        # which llama.cpp (and API prompt caches) compute once.
        messages = [
            {"role": "system", "content": render("verify_system",
                                                 reason_field=', "reason": "<one short sentence>"' if reasons else "")},
            {"role": "user", "content": render("verify_user", passages=passages, statement=as_data(statement))},
        ]
        properties: dict[str, Any] = {"verdict": {"type": "string", "enum": [v.value for v in Judgment]}}
        if reasons:
            properties["reason"] = {"type": "string", "maxLength": 200}
        schema = {"type": "object", "properties": properties, "required": list(properties)}
        reply = meter.count("verify", await self.llm.complete(
            messages, model=model, max_tokens=80 if reasons else 16, json_schema=schema,
            top_logprobs=5 if self.options.soft_verdicts else 0))
        probabilities = judgment_probabilities(reply.logprobs) if self.options.soft_verdicts else None
        return self._scored(model, passages, kind, statement, parse_judgment(reply.text), probabilities, reply.model)


def _explanation(variants: list[Variant]) -> str:
    """The judge's own words on the variants it scored against the claim (penalised ones first), for a reviewer."""
    said = [v for v in sorted(variants, key=lambda v: -v.penalty) if v.reason and v.penalty > 0]
    return "; ".join(dict.fromkeys(f"the judge on “{v.text}”: {v.reason}" for v in said[:2]))

def _label(variants: list[Variant], score: float, threshold: float) -> Label:
    """Supported below the threshold; above it, contradicted when the verifier's refutations outweigh its
    doubts (NO for the factoid or its synonyms, YES for its antonyms), else unsupported."""
    if score < threshold:
        return "supported"
    refuted = doubted = 0.0
    for v in variants:
        p = v.probabilities or {v.verdict.value: 1.0}
        against = Judgment.YES.value if v.kind is VariantKind.ANTONYM else Judgment.NO.value
        refuted += p.get(against, 0.0)
        doubted += p.get(Judgment.NOT_SURE.value, 0.0)
    return "contradicted" if refuted >= doubted else "unsupported"


def _cache_key(model: str | None, passages: str, statement: str, soft: bool) -> str:
    return hashlib.sha256(json.dumps([model, passages, statement, soft]).encode()).hexdigest()


async def _just(value: T) -> T:
    return value


def _strings_or_none(text: str, key: str) -> list[str] | None:
    found = json_list(text, key, lenient=True)
    return strings(found) if found is not None else None


def _unique(items: list[str]) -> list[str]:
    seen: set[str] = set()
    return [s for s in items if not (s.lower() in seen or seen.add(s.lower()))]  # type: ignore[func-returns-value]


def _prompts(settings: MetaRAGSettings) -> list[str]:
    options = resolve_options(settings)
    names = ["decompose_system", "decompose_user", "synonym_system", "antonym_system", "mutate_user",
             "verify_system", "verify_user"]
    if options.batch_mutations:
        names += ["mutate_batch_system", "mutate_batch_user"]
    if options.batch_verify != "none":
        names += ["verify_batch_system", "verify_batch_user"]
    return names


def _fingerprint(settings: MetaRAGSettings) -> dict[str, Any]:
    options = asdict(resolve_options(settings))
    # The cache never changes a verdict, and a fast-check switch left off is the behaviour from before
    # it existed: neither makes earlier results stale.
    options.pop("verdict_cache")
    for switch, off in (("batch_mutations", False), ("batch_verify", "none"), ("rule_antonyms", False),
                        ("decompose", "llm"), ("context_budget", 0)):
        if options[switch] == off:
            options.pop(switch)
    # Soft scores are read from log-probabilities; `logprob_reader` 2 finds the verdict token among the generated
    # tokens, not in the reply text (which can lack a ```json fence the tokens have).
    return {"options": options, **({"logprob_reader": 2} if options["soft_verdicts"] else {})}


def _models(settings: MetaRAGSettings) -> list[str | None]:
    options = resolve_options(settings)
    return [options.decompose_model, options.mutate_model, *options.verify_models]


SPEC = register(DetectorSpec(
    name="metarag", settings=MetaRAGSettings, profiles=tuple(PROFILES),
    build=lambda settings, threshold, llm: MetaRAG(llm, resolve_options(settings), threshold),
    models=_models, prompts=_prompts, fingerprint=_fingerprint))
