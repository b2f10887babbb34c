"""What a chat request body and an upstream answer must look like before anything else reads them.

Both are hostile input. A body is a 400 naming the field, never a crash further in: JSON deeper than
`MAX_JSON_DEPTH` levels, `NaN`, non-string text parts and the like are refused here. An upstream answer
that is not a readable chat completion is a 502, so what the client gets is always what was checked.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from morphguard.detectors import SPECS, is_known
from morphguard.proxy.context import OUR_FIELD
from morphguard.proxy.errors import bad_request, upstream_malformed

MAX_JSON_DEPTH = 64
OFFLOAD_BYTES = 64_000  # bodies above this are parsed and scanned off the event loop


# Every digit becomes "0" and every other byte a space: 19 digits in a row are then a plain substring search,
# ten times faster than a regular expression over the body. orjson reads an integer past 64 bits as a float: from
# 20 digits up, and from 19 where it is negative (below -9223372036854775808).
_DIGITS_AS_ZERO = bytes(ord("0") if ord("0") <= b <= ord("9") else ord(" ") for b in range(256))
_LONG_DIGITS = b"0" * 19


def reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads(data: bytes | str) -> Any:
    """JSON as the standard library reads it (NaN and Infinity refused), mostly read by orjson, which is
    several times faster: a document orjson refuses, or whose integers it could read as floats (beyond
    64 bits, so 19 digits or more), is read by the standard library. ValueError or RecursionError if invalid."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if _LONG_DIGITS not in raw.translate(_DIGITS_AS_ZERO):
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    return json.loads(data, parse_constant=reject_constant)


def loads_upstream(data: bytes) -> Any:
    try:
        return loads(data)
    except (ValueError, RecursionError):
        raise upstream_malformed("the body is not valid JSON") from None


def chat_completion(value: Any) -> dict[str, Any]:
    """A chat completion with a readable first answer, or a 502: what the client gets is what we checked."""
    try:
        message = value["choices"][0]["message"]
        ok = isinstance(message, dict) and isinstance(message.get("content"), (str, type(None))) \
            and all(isinstance(c, dict) for c in value["choices"])
    except (KeyError, IndexError, TypeError):
        ok = False
    if not ok:
        raise upstream_malformed("not a chat completion with a text answer")
    return value


def depth_ok(value: Any, limit: int) -> bool:
    """Nesting no deeper than `limit`, checked without recursion."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return False
        if isinstance(node, dict):
            stack.extend((child, depth + 1) for child in node.values() if isinstance(child, (dict, list)))
        elif isinstance(node, list):
            stack.extend((child, depth + 1) for child in node if isinstance(child, (dict, list)))
    return True


def parse_object(raw: bytes) -> dict[str, Any]:
    """A request body: a JSON object, not too deep, no NaN; `model`, `stream` and our field well typed."""
    try:
        body = loads(raw)
    except RecursionError:
        raise bad_request(f"The request body is nested too deeply (at most {MAX_JSON_DEPTH} levels).") from None
    except ValueError:
        raise bad_request("The request body is not valid JSON.") from None
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    # Each level opens a bracket: with no more brackets than the limit, there is nothing to walk.
    if raw.count(b"{") + raw.count(b"[") > MAX_JSON_DEPTH and not depth_ok(body, MAX_JSON_DEPTH):
        raise bad_request(f"The request body is nested too deeply (at most {MAX_JSON_DEPTH} levels).")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise bad_request("'stream' must be a boolean.", "stream")
    if "model" in body and not isinstance(body["model"], str):
        raise bad_request("'model' must be a string.", "model")
    _check_ours(body.get(OUR_FIELD))
    return body


def parse_chat(raw: bytes) -> dict[str, Any]:
    body = parse_object(raw)
    messages = body.get("messages")
    if messages is None:
        raise bad_request("Missing required parameter: 'messages'.", "messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty array.", "messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise bad_request(f"messages[{i}] must be an object with a string 'role'.", f"messages[{i}]")
        check_content(message.get("content"), f"messages[{i}].content")
    return body


def _check_ours(ours: Any) -> None:
    if ours is None:
        return
    if not isinstance(ours, dict):
        raise bad_request(f"'{OUR_FIELD}' must be an object.", OUR_FIELD)
    if ours.get("detector") is not None and not (isinstance(ours["detector"], str) and is_known(ours["detector"])):
        profiles = ", ".join(f"{name}:{p}" for name in sorted(SPECS) for p in SPECS[name].profiles)
        raise bad_request(f"'{OUR_FIELD}.detector' must be one of: {', '.join(sorted(SPECS))}, {profiles}.",
                          f"{OUR_FIELD}.detector")
    for key in ("topic", "policy"):
        if ours.get(key) is not None and not isinstance(ours[key], str):
            raise bad_request(f"'{OUR_FIELD}.{key}' must be a string.", f"{OUR_FIELD}.{key}")
    context = ours.get("context")
    if context is not None and not (isinstance(context, str) or (
            isinstance(context, list) and all(isinstance(p, str) for p in context))):
        raise bad_request(f"'{OUR_FIELD}.context' must be a string or an array of strings.", f"{OUR_FIELD}.context")


def check_content(content: Any, where: str) -> None:
    """A message's content: null, a string, or an array of parts whose `text` (if any) is a string."""
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        raise bad_request(f"'{where}' must be a string or an array of content parts.", where)
    for j, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type", ""), str):
            raise bad_request(f"'{where}[{j}]' must be an object with a string 'type'.", f"{where}[{j}]")
        if "text" in part and not isinstance(part["text"], str):
            raise bad_request(f"'{where}[{j}].text' must be a string.", f"{where}[{j}].text")
