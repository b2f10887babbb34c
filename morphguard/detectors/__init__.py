"""Hallucination detectors, registered by name in one place."""

from __future__ import annotations

from typing import Protocol

from morphguard.config import Config
from morphguard.detectors.metarag import MetaRAG, resolve_options
from morphguard.llm import LLMClient, build_client
from morphguard.models import Detection, RagInput


class Detector(Protocol):
    name: str

    async def detect(self, rag: RagInput, answer: str) -> Detection: ...


def stage_models(config: Config) -> list[str | None]:
    """Every model name the configured detector will call (None = the judge's default)."""
    options = resolve_options(config.metarag)
    return [options.decompose_model, options.mutate_model, *options.verify_models]


def build_detector(config: Config, llm: LLMClient | None = None) -> Detector:
    if llm is None:
        llm = build_client(config, stage_models(config))
    if config.detector.name == "metarag":
        return MetaRAG(llm, resolve_options(config.metarag), threshold=config.detector.threshold)
    raise ValueError(f"unknown detector {config.detector.name!r}")  # config validation keeps this unreachable
