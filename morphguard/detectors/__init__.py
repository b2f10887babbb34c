"""Hallucination detectors, registered by name in one place.

A name is `metarag`, `claims`, `hierarchical`, `direct` or `length`; `metarag:PROFILE` picks a MetaRAG profile (`paper`,
`embedded`, `batched`) over the one in the config, so an evaluation can set profiles side by side.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from morphguard.config import Config
from morphguard.detectors.baselines import DirectJudge, LengthBaseline
from morphguard.detectors.claims import ClaimJudge, ClaimsOptions
from morphguard.detectors.hierarchical import HierarchicalOptions, HierarchicalVerifier
from morphguard.detectors.metarag import PROFILES, MetaRAG, resolve_options
from morphguard.llm import LLMClient, build_client
from morphguard.models import Detection, RagInput


class Detector(Protocol):
    name: str

    async def detect(self, rag: RagInput, answer: str) -> Detection: ...


def _metarag(config: Config, llm: LLMClient) -> Detector:
    return MetaRAG(llm, resolve_options(config.metarag), threshold=config.detector.threshold)


def _direct(config: Config, llm: LLMClient) -> Detector:
    return DirectJudge(llm, threshold=config.detector.threshold)


def _claims(config: Config, llm: LLMClient) -> Detector:
    return ClaimJudge(llm, ClaimsOptions(**config.claims.model_dump()), threshold=config.detector.threshold)


def _hierarchical(config: Config, llm: LLMClient) -> Detector:
    return HierarchicalVerifier(llm, HierarchicalOptions(**config.hierarchical.model_dump()),
                                threshold=config.detector.threshold)


# name → (builder, needs an LLM)
DETECTORS: dict[str, tuple[Callable[[Config, LLMClient], Detector], bool]] = {
    "metarag": (_metarag, True),
    "claims": (_claims, True),
    "hierarchical": (_hierarchical, True),
    "direct": (_direct, True),
    "length": (lambda config, llm: LengthBaseline(threshold=config.detector.threshold), False),
}


def is_known(name: object) -> bool:
    """Whether `name` names a registered detector (or a MetaRAG profile as `metarag:PROFILE`)."""
    if not isinstance(name, str):
        return False
    base, _, profile = name.partition(":")
    return base in DETECTORS and (not profile or (base == "metarag" and profile in PROFILES))


def resolve(config: Config, name: str | None = None) -> tuple[str, Config]:
    """The registered detector name and the config it runs with, for `name` (default: the configured one)."""
    name = name or config.detector.name
    base, _, profile = name.partition(":")
    if base not in DETECTORS:
        raise ValueError(f"unknown detector {base!r}; choose from {', '.join(sorted(DETECTORS))}")
    if profile:
        if base != "metarag" or profile not in PROFILES:
            raise ValueError(f"unknown profile {name!r}; MetaRAG profiles: {', '.join(sorted(PROFILES))}")
        config = config.model_copy(update={"metarag": config.metarag.model_copy(update={"profile": profile})})
    return base, config


def stage_models(config: Config, name: str | None = None) -> list[str | None]:
    """Every model name the detector will call (None = the judge's default)."""
    base, config = resolve(config, name)
    if base == "metarag":
        options = resolve_options(config.metarag)
        return [options.decompose_model, options.mutate_model, *options.verify_models]
    if base in ("claims", "hierarchical"):
        return [getattr(config, base).model]
    return [None] if DETECTORS[base][1] else []


def build_detector(config: Config, llm: LLMClient | None = None, name: str | None = None) -> Detector:
    base, config = resolve(config, name)
    builder, needs_llm = DETECTORS[base]
    if llm is None and needs_llm:
        llm = build_client(config, stage_models(config, name))
    detector = builder(config, llm)  # type: ignore[arg-type]
    if name and ":" in name:
        detector.name = name  # keep the profile in results: "metarag:paper"
    return detector
