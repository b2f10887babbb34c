"""morphguard: check a RAG answer against its retrieved context.

    >>> from morphguard import detect
    >>> result = detect("Can pregnant women take ibuprofen?",
    ...                 ["Ibuprofen is contraindicated in the third trimester of pregnancy."],
    ...                 "Yes, ibuprofen is safe throughout pregnancy.")
    >>> result.flagged, result.score

`detect` is the synchronous form, `adetect` the async one. Without a config they use the built-in
defaults (the embedded local judge), started once and reused.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from morphguard.config import Config, load_config
from morphguard.detectors import Detector, build_detector  # also registers the detectors' config sections
from morphguard.errors import MorphguardError
from morphguard.models import (
    Cost,
    Detection,
    Factoid,
    RagInput,
    Variant,
    VariantKind,
    Verdict,
)

__all__ = [
    "Config", "Cost", "Detection", "Factoid", "MorphguardError", "RagInput", "Variant", "VariantKind", "Verdict",
    "adetect", "detect", "load_config",
]

_detectors: dict[str, object] = {}


async def adetect(question: str, passages: str | Sequence[str], answer: str, *,
                  config: Config | None = None) -> Detection:
    """Score `answer` against `passages` (the retrieved context) for `question`."""
    config = config or Config()
    key = config.model_dump_json()
    detector: Detector = _detectors.get(key) or _detectors.setdefault(key, build_detector(config))  # type: ignore[assignment]
    passages = [passages] if isinstance(passages, str) else list(passages)
    return await detector.detect(RagInput(question=question, passages=passages), answer)


def detect(question: str, passages: str | Sequence[str], answer: str, *, config: Config | None = None) -> Detection:
    """The synchronous form of `adetect` (not for use inside a running event loop)."""
    return asyncio.run(adetect(question, passages, answer, config=config))
