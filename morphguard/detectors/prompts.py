"""Prompt templates are text files in prompts/, loaded once and filled by name."""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import cache
from importlib import resources

# Words that open or close our delimiters; removed from data so an answer cannot close a tag early.
_TAGS = re.compile(r"</?\s*(passages|statement|question|answer|source|restatement)\s*>", re.I)


@cache
def template(name: str) -> str:
    return resources.files("morphguard.detectors").joinpath("prompts", f"{name}.txt").read_text(encoding="utf-8")


def render(name: str, **values: object) -> str:
    """Fill `{key}` placeholders; other braces (JSON examples) are left alone."""
    text = template(name)
    for key, value in values.items():
        text = text.replace("{" + key + "}", str(value))
    return text.strip()


def as_data(text: str) -> str:
    """Untrusted text made safe to place between our tags."""
    return _TAGS.sub(lambda m: m.group(0).replace("<", "‹").replace(">", "›"), text.strip())


def numbered(passages: Sequence[str]) -> str:
    """Passages as `[1] …`, `[2] …` blocks, each made safe as data; an empty passage keeps its number
    but is left out (focused contexts blank out what they drop)."""
    return "\n\n".join(f"[{i}] {as_data(p)}" for i, p in enumerate(passages, 1) if p)
