"""What a chat request body and an upstream answer must look like before anything else reads them.

Both are hostile input. A body is a 400 naming the field, never a crash further in: JSON deeper than
`MAX_JSON_DEPTH` levels or of more than `MAX_JSON_VALUES` values, `NaN`, non-string text parts and the like
are refused here. An upstream answer that is not a readable chat completion is a 502, so what the client gets
is always what was checked.

A body's size is bounded (`proxy.max_body_bytes`), but not what parsing it costs: 3 MB of brackets are 1.5
million lists, half a second of the parser holding the GIL (the event loop stalls, even with the parse in a
thread) and as long again to walk them. So the shape of a body is measured on its bytes, before the parser
builds anything: how deep it nests and how many values it holds, outside its strings, in a few passes of
`bytes` methods (C, milliseconds for the largest body). Only a body within both bounds is parsed.
"""

from __future__ import annotations

import json
from itertools import accumulate
from typing import Any

import orjson

from morphguard.detectors import SPECS, is_known
from morphguard.proxy.context import OUR_FIELD
from morphguard.proxy.errors import bad_request, upstream_malformed

MAX_JSON_DEPTH = 64
OFFLOAD_BYTES = 64_000  # bodies above this are parsed and scanned off the event loop
# Values (objects, arrays, keys and scalars) in one request body. A chat body holds a few thousand (a message is an
# object with two keys and two strings); 100,000 of the dearest kind (lists) cost the parser ~25 ms with the GIL held.
MAX_JSON_VALUES = 100_000


class TooManyValues(ValueError):
    """A document with more values than allowed."""


# Every digit becomes "0" and every other byte a space: 19 digits in a row are then a plain substring search,
# ten times faster than a regular expression over the body. orjson reads an integer past 64 bits as a float: from
# 20 digits up, and from 19 where it is negative (below -9223372036854775808).
_DIGITS_AS_ZERO = bytes(ord("0") if ord("0") <= b <= ord("9") else ord(" ") for b in range(256))
_LONG_DIGITS = b"0" * 19
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_DEPTH_STEP = [1 if b in b"[{" else -1 if b in b"]}" else 0 for b in range(256)]


def reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads(data: bytes | str, *, max_depth: int | None = None, max_values: int | None = None) -> Any:
    """JSON as the standard library reads it (NaN and Infinity refused), mostly read by orjson, which is
    several times faster: a document orjson refuses, or whose integers it could read as floats (beyond
    64 bits, so 19 digits or more), is read by the standard library. ValueError or RecursionError if invalid.

    With `max_depth` / `max_values`: a document nested deeper is a RecursionError, one with more values a
    `TooManyValues`, both found before anything is parsed."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if max_depth is not None or max_values is not None:
        raw = _as_utf8(raw)
        _check_shape(raw, max_depth if max_depth is not None else 1 << 30,
                    max_values if max_values is not None else 1 << 62)
        data = raw
    if _LONG_DIGITS not in raw.translate(_DIGITS_AS_ZERO):
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    return json.loads(data, parse_constant=reject_constant)


def _as_utf8(raw: bytes) -> bytes:
    """UTF-16 and UTF-32 (which the standard library reads too) as UTF-8, whose bytes `check_shape` can read."""
    encoding = json.detect_encoding(raw)
    if encoding in ("utf-8", "utf-8-sig"):
        return raw
    return raw.decode(encoding, "surrogatepass").encode("utf-8", "surrogatepass")


def _check_shape(raw: bytes, max_depth: int, max_values: int) -> None:
    """Raise RecursionError if the UTF-8 JSON `raw` nests deeper than `max_depth`, TooManyValues if it holds
    more than `max_values` values, counted as its opening brackets, commas and colons (each value but the first
    of a container follows a comma, each key precedes a colon). Exact for a document a parser reads; one it
    refuses may be counted high, never low before the point where the parser stops."""
    opens = raw.count(b"[") + raw.count(b"{")
    if opens <= max_depth and opens + raw.count(b",") + raw.count(b":") <= max_values:
        return  # counted inside strings too, and within both bounds all the same
    # Every string but a lone top-level one is counted (a key, a container's first value or one after a comma):
    # with surely more strings than that, stop here. An escaped quote is no string's end.
    if (raw.count(b'"') - raw.count(b'\\"')) // 2 > max_values + 1:
        raise TooManyValues(f"more than {max_values} values")
    # What lies outside the strings: escaped backslashes and quotes taken out, every other quote opens or
    # closes a string, so the even pieces between quotes are the document's structure.
    outside = b"".join(raw.replace(b"\\\\", b"").replace(b'\\"', b"").split(b'"')[::2])
    opens = outside.count(b"[") + outside.count(b"{")
    if opens + outside.count(b",") + outside.count(b":") > max_values:
        raise TooManyValues(f"more than {max_values} values")
    # The running depth at each bracket, as C iterators over the brackets alone (at most 2 * max_values of them).
    if opens > max_depth and max(accumulate(map(_DEPTH_STEP.__getitem__, outside.translate(None, _NOT_BRACKETS)))) \
            > max_depth:
        raise RecursionError(f"nested deeper than {max_depth} levels")


def loads_upstream(data: bytes) -> Any:
    try:
        return loads(data)
    except (ValueError, RecursionError):
        raise upstream_malformed("the body is not valid JSON") from None


def chat_completion(value: Any) -> dict[str, Any]:
    """A chat completion with a readable first answer, or a 502: what the client gets is what we checked. Its
    content is null, a string, or a list of parts (objects; a part's `text` or `refusal`, if any, a string)."""
    try:
        message = value["choices"][0]["message"]
        ok = isinstance(message, dict) and readable_content(message.get("content")) \
            and all(isinstance(c, dict) for c in value["choices"])
    except (KeyError, IndexError, TypeError):
        ok = False
    if not ok:
        raise upstream_malformed("not a chat completion with a text answer")
    return value


def readable_content(content: Any) -> bool:
    """An answer's content (or a streamed delta's) as `policy.answers` reads it: null, a string, or a list of parts
    whose text and refusal, where they have them, are strings."""
    if content is None or isinstance(content, str):
        return True
    return isinstance(content, list) and all(
        isinstance(p, dict) and all(isinstance(p[key], str) for key in ("text", "refusal") if key in p)
        for p in content)


def parse_object(raw: bytes) -> dict[str, Any]:
    """A request body: a JSON object, not too deep nor too many values, no NaN; `model`, `stream` and our field well
    typed."""
    try:
        body = loads(raw, max_depth=MAX_JSON_DEPTH, max_values=MAX_JSON_VALUES)
    except RecursionError:
        raise bad_request(f"The request body is nested too deeply (at most {MAX_JSON_DEPTH} levels).") from None
    except TooManyValues:
        raise bad_request(f"The request body holds too many JSON values (at most {MAX_JSON_VALUES}).") from None
    except ValueError:
        raise bad_request("The request body is not valid JSON.") from None
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
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


def str_or_none(value: Any) -> str | None:
    """A field that should be a string, where a client or provider may have sent anything."""
    return value if isinstance(value, str) else None


def int_or_none(value: Any) -> int | None:
    """A field that should be an integer (a bool is none)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None
