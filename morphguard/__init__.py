"""morphguard: check a RAG answer against its retrieved context.

    >>> from morphguard import detect
    >>> result = detect("Can pregnant women take ibuprofen?",
    ...                 ["Ibuprofen is contraindicated in the third trimester of pregnancy."],
    ...                 "Yes, ibuprofen is safe throughout pregnancy.")
    >>> result.flagged, result.score

`detect` is the synchronous form, `adetect` the async one. Without a config they use the built-in
defaults (the embedded local judge), started once and reused.

Importing the package imports nothing else: each public name is loaded on first use, so that
`import morphguard.config` (and the CLI's help) stay fast while the detectors and the LLM layer load
only where a check is made.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from morphguard.config import Config, load_config
    from morphguard.errors import MorphguardError
    from morphguard.models import Cost, Detection, Factoid, Judgment, RagInput, Variant, VariantKind

__all__ = [
    "Config", "Cost", "Detection", "Factoid", "Judgment", "MorphguardError", "RagInput", "Variant", "VariantKind",
    "adetect", "detect", "load_config",
]

# Where each public name lives; `Verdict` is the deprecated name of `Judgment` (models.py warns of it).
_LAZY = {"Config": "morphguard.config", "load_config": "morphguard.config", "MorphguardError": "morphguard.errors",
         **{name: "morphguard.models" for name in ("Cost", "Detection", "Factoid", "Judgment", "RagInput", "Variant",
                                                    "VariantKind", "Verdict")}}

_detectors: dict[str, Any] = {}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'morphguard' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


async def adetect(question: str, passages: str | Sequence[str], answer: str, *,
                  config: Config | None = None) -> Detection:
    """Score `answer` against `passages` (the retrieved context) for `question`."""
    from morphguard.config import Config
    from morphguard.detectors import build_detector
    from morphguard.models import RagInput

    config = config or Config()
    key = config.model_dump_json()
    detector = _detectors.get(key) or _detectors.setdefault(key, build_detector(config))
    passages = [passages] if isinstance(passages, str) else list(passages)
    result: Detection = await detector.detect(RagInput(question=question, passages=passages), answer)
    return result


def detect(question: str, passages: str | Sequence[str], answer: str, *, config: Config | None = None) -> Detection:
    """The synchronous form of `adetect` (not for use inside a running event loop)."""
    import asyncio

    return asyncio.run(adetect(question, passages, answer, config=config))
