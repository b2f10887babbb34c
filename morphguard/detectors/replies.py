"""Reading fields out of the judge's JSON replies, one way for every detector.

Replies are asked for under a JSON schema, but a small judge still sends a bare list now and then, or a
list wrapped in prose; `lenient` also accepts those. Nothing here raises: an unreadable reply is None.
"""

from __future__ import annotations

import json
import re
from typing import Any

_LIST = re.compile(r"\[.*\]", re.S)


def json_object(text: str) -> dict[str, Any] | None:
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def json_list(text: str, key: str, *, lenient: bool = False) -> list[Any] | None:
    """The list under `key` of a JSON object reply; with `lenient`, also a bare list or the first `[...]`."""
    try:
        data = json.loads(text)
    except ValueError:
        if not lenient:
            return None
        match = _LIST.search(text)
        try:
            data = json.loads(match.group(0)) if match else None
        except ValueError:
            return None
    if isinstance(data, dict):
        data = data.get(key)
    elif not lenient:
        return None
    return data if isinstance(data, list) else None


def strings(items: list[Any] | None) -> list[str]:
    """The non-blank strings of a list, stripped."""
    return [s.strip() for s in items or [] if isinstance(s, str) and s.strip()]
