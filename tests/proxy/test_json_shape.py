"""A request body's depth and number of values are measured on its bytes, before it is parsed, and exactly:
whatever its strings hold (brackets, quotes, backslashes) and however it is encoded."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from morphguard.proxy.body import MAX_JSON_VALUES, TooManyValues, loads, parse_chat
from morphguard.proxy.errors import ProxyError

tricky = st.text(alphabet=st.sampled_from('[]{}",:\\ab\n\u00e9\U0001f600'), max_size=8)
scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10 ** 30), max_value=10 ** 30), tricky)
documents = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                          st.dictionaries(tricky, inner, max_size=4)),
                         max_leaves=30)


def depth(value: object) -> int:
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    return 0


def counted(value: object) -> int:
    """Opening brackets, commas and colons, as the document's structure has them."""
    if isinstance(value, dict):
        return 1 + max(len(value) - 1, 0) + len(value) + sum(map(counted, value.values()))
    if isinstance(value, list):
        return 1 + max(len(value) - 1, 0) + sum(map(counted, value))
    return 0


def outcome(raw: bytes | str, max_depth: int, max_values: int) -> object:
    try:
        return loads(raw, max_depth=max_depth, max_values=max_values)
    except (TooManyValues, RecursionError) as exc:
        return type(exc)


@settings(max_examples=500, deadline=None)
@given(documents, st.integers(-1, 1), st.integers(-1, 1), st.sampled_from(["compact", "spaced", "ascii", "utf-16"]))
def test_a_document_is_refused_exactly_when_it_is_too_deep_or_holds_too_many_values(document, dd, dv, form):
    text = json.dumps(document, ensure_ascii=form == "ascii", separators=(",", ":") if form == "compact" else None,
                      indent=1 if form == "spaced" else None)
    raw = text.encode("utf-16" if form == "utf-16" else "utf-8")
    max_depth, max_values = max(depth(document) + dd, 1), max(counted(document) + dv, 1)
    expected: object = document
    if counted(document) > max_values:
        expected = TooManyValues
    elif depth(document) > max_depth:
        expected = RecursionError
    got = outcome(raw, max_depth, max_values)
    assert got == expected if isinstance(expected, type) else json.dumps(got) == json.dumps(expected)


def test_the_bounds_of_a_request_body():
    deep = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "x": json.loads("[" * 63 + "]" * 63)}
    assert parse_chat(json.dumps(deep).encode())["x"] == deep["x"]  # 64 levels with the body itself
    deep["x"] = [deep["x"]]
    with pytest.raises(ProxyError, match="nested too deeply"):
        parse_chat(json.dumps(deep).encode())
    many = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "x": [0] * MAX_JSON_VALUES}
    with pytest.raises(ProxyError, match="too many JSON values"):
        parse_chat(json.dumps(many).encode())
    # Brackets, quotes and commas inside strings are text, not structure.
    text = ('he said "[[[{,:}]]]" \\' * 100_000)
    body = {"model": "m", "messages": [{"role": "user", "content": text}]}
    assert parse_chat(json.dumps(body).encode())["messages"][0]["content"] == text


def test_a_body_of_a_million_nested_lists_is_refused_before_it_is_parsed():
    one = "[" * 60 + "]" * 60
    raw = ('{"model":"m","messages":[{"role":"user","content":"hi"}],"x":[' + ",".join([one] * 25_000) + "]}").encode()
    started = time.process_time()
    with pytest.raises(ProxyError, match="too many JSON values"):
        parse_chat(raw)
    print(f"refused in {(time.process_time() - started) * 1000:.1f} ms of CPU")
