"""The proxy reads and writes JSON with orjson where it can, and must agree with the standard library."""

from __future__ import annotations

import json
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from morphguard.proxy.body import loads, reject_constant
from morphguard.proxy.errors import json_bytes

scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10 ** 30), max_value=10 ** 30),
                    st.floats(allow_nan=False, allow_infinity=False), st.text())
documents = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                          st.dictionaries(st.text(max_size=6), inner, max_size=4)),
                         max_leaves=20)


def standard(data: bytes | str) -> object:
    try:
        return json.loads(data, parse_constant=reject_constant)
    except (ValueError, RecursionError) as exc:
        return type(exc)


def ours(data: bytes | str) -> object:
    try:
        return loads(data)
    except (ValueError, RecursionError) as exc:
        return type(exc)


def same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    return type(a) is type(b) and (a == b if not isinstance(a, (list, dict)) else json_text(a) == json_text(b))


def json_text(value: object) -> str:
    return json.dumps(value, sort_keys=True, default=repr)


@settings(max_examples=400, deadline=None)
@given(documents)
def test_any_document_reads_as_the_standard_library_reads_it(document):
    for text in (json.dumps(document), json.dumps(document, ensure_ascii=False)):
        assert same(ours(text.encode("utf-8", "surrogatepass")), standard(text.encode("utf-8", "surrogatepass")))


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=40) | st.text(max_size=40).map(lambda t: t.encode("utf-8", "surrogatepass")))
def test_any_bytes_read_or_fail_as_with_the_standard_library(raw):
    assert same(ours(raw), standard(raw))


def test_the_edges_orjson_reads_differently_fall_back():
    for raw in (b'{"seed": 123456789012345678901234567890}', b'{"seed": -9223372036854775809}', b'"\\ud800"',
                b"[1e400]", b"[NaN]", b"\xef\xbb\xbf[1]", b"[" * 2000 + b"]" * 2000):
        assert same(ours(raw), standard(raw)), raw


@settings(max_examples=300, deadline=None)
@given(documents)
def test_what_is_written_reads_back_as_the_same_document(document):
    assert json_text(json.loads(json_bytes(document))) == json_text(document)
