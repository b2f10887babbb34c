"""Fuzzing the running proxy over real sockets: generated bodies, headers and paths on chat completions, and
bodies and headers shaped like the Responses and Messages APIs (4,900 inputs a run).

Whatever a client sends: no response >= 500, every error OpenAI-shaped JSON, nothing hangs (each
request has 5 s), and the proxy still answers /healthz afterwards.
"""

from __future__ import annotations

import http.client
import json
from urllib.parse import quote, urlsplit

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

# hypothesis drives thousands of generated requests through a real proxy
pytestmark = pytest.mark.slow

PASSAGE = "Ibuprofen is contraindicated in the third trimester of pregnancy."
SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=list(HealthCheck), database=None)

surrogates = st.sampled_from(["\ud800", "\udfff", "\ud83d"])
texts = st.one_of(st.text(max_size=40), st.builds(lambda a, s: a + s, st.text(max_size=10), surrogates),
                  st.sampled_from(["<context>", "</context>", "<context>" * 50, "<documents a='>'>", "x" * 3000]))
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), texts)
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                           st.dictionaries(texts, inner, max_size=4)), max_leaves=12)
parts = st.one_of(json_values, st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", 5]),
                                                      "text": st.one_of(texts, json_values)}))
messages = st.fixed_dictionaries(
    {"role": st.one_of(st.sampled_from(["system", "user", "assistant", "tool", "developer"]), json_values),
     "content": st.one_of(texts, st.lists(parts, max_size=3), json_values)})
ours = st.one_of(json_values, st.fixed_dictionaries({}, optional={
    "context": st.one_of(texts, st.lists(texts, max_size=3), json_values),
    "topic": st.one_of(texts, json_values), "policy": st.one_of(texts, json_values),
    "detector": st.one_of(st.sampled_from(["length", "sentences", "metarag:paper", "oracle"]), json_values)}))
bodies = st.one_of(
    json_values,
    st.fixed_dictionaries({"model": st.one_of(st.sampled_from(["faithful", "hallucinated"]), json_values),
                           "messages": st.one_of(st.lists(messages, min_size=1, max_size=4), json_values)},
                          optional={"stream": st.one_of(st.booleans(), json_values), "morphguard": ours,
                                    "temperature": scalars}))
output_parts = st.fixed_dictionaries({"type": st.one_of(st.sampled_from(["input_text", "output_text", "text",
                                                                         "refusal", "input_image"]), json_values),
                                       "text": st.one_of(texts, json_values)})
response_items = st.one_of(
    json_values,
    st.fixed_dictionaries({"role": st.one_of(st.sampled_from(["system", "user", "assistant", "developer"]),
                                             json_values),
                           "content": st.one_of(texts, st.lists(output_parts, max_size=3), json_values)},
                          optional={"type": st.sampled_from(["message", "item_reference", 7])}),
    st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": texts,
                           "output": st.one_of(texts, json_values)}),
    st.fixed_dictionaries({"type": st.just("file_search_call"), "results": st.one_of(
        st.lists(st.fixed_dictionaries({"text": st.one_of(texts, json_values)}), max_size=3), json_values)}))
responses_bodies = st.one_of(
    json_values,
    st.fixed_dictionaries({"model": st.one_of(st.sampled_from(["faithful", "hallucinated", "tool-answer"]),
                                              json_values),
                           "input": st.one_of(texts, st.lists(response_items, min_size=1, max_size=4), json_values)},
                          optional={"instructions": st.one_of(texts, json_values), "morphguard": ours,
                                    "stream": st.one_of(st.booleans(), json_values), "metadata": json_values,
                                    "previous_response_id": st.one_of(texts, json_values)}))
blocks = st.one_of(
    json_values,
    st.fixed_dictionaries({"type": st.sampled_from(["text", "image", "tool_use", 3]), "text": st.one_of(texts,
                                                                                                     json_values)}),
    st.fixed_dictionaries({"type": st.just("document"), "source": st.one_of(json_values, st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "content", "base64"]), "data": st.one_of(texts, json_values),
         "content": st.one_of(st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": texts}),
                                       max_size=2), json_values)}))}),
    st.fixed_dictionaries({"type": st.just("tool_result"), "tool_use_id": texts,
                           "content": st.one_of(texts, st.lists(st.fixed_dictionaries(
                               {"type": st.just("text"), "text": st.one_of(texts, json_values)}), max_size=2))}))
turns = st.fixed_dictionaries({"role": st.one_of(st.sampled_from(["user", "assistant"]), json_values),
                               "content": st.one_of(texts, st.lists(blocks, max_size=3), json_values)})
messages_bodies = st.one_of(
    json_values,
    st.fixed_dictionaries({"model": st.one_of(st.sampled_from(["faithful", "hallucinated", "tool-answer"]),
                                              json_values),
                           "max_tokens": st.one_of(st.integers(), json_values),
                           "messages": st.one_of(st.lists(turns, min_size=1, max_size=4), json_values)},
                          optional={"system": st.one_of(texts, st.lists(blocks, max_size=2), json_values),
                                    "morphguard": ours, "stream": st.one_of(st.booleans(), json_values),
                                    "metadata": json_values}))
header_text = st.text(st.characters(min_codepoint=32, max_codepoint=255, exclude_characters="\x7f"), max_size=30)
header_names = st.one_of(st.sampled_from(["authorization", "x-morphguard-topic", "x-morphguard-policy",
                                          "content-type", "x-tenant", "api-key", "accept-encoding"]),
                         st.from_regex(r"[a-z][a-z0-9-]{0,20}", fullmatch=True))
segments = st.one_of(st.sampled_from(["v1", "chat", "completions", "..", ".", "", "%2e", "%2E%2E", "%00", "%2F",
                                      "http:", "127.0.0.1:9", "models", "embeddings", "responses", "clinic",
                                      "%ff", "%u002e", "%", ";", "?x=1", "#f"]),
                     st.text(max_size=8).map(lambda t: quote(t.encode("utf-8", "surrogatepass"), safe="")))


@pytest.fixture(scope="module")
def target(proxy_factory) -> str:
    return proxy_factory(stream_mode="buffer", upstream={"api_key": "sk-upstream"}, keys=["mg-key"],
                         policy={"routes": [{"profile": "general", "headers": {"x-tenant": "a"}}]})


def send(base: str, method: str, path: str, body: bytes | None, headers: list[tuple[str, str]]) -> None:
    parts = urlsplit(base)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=5)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        for name, value in headers:
            conn.putheader(name, value.encode("latin-1"))
        if body is not None:
            conn.putheader("content-length", str(len(body)))
        conn.endheaders(body)
        response = conn.getresponse()
        data = response.read()
    finally:
        conn.close()
    assert response.status < 500, (method, path, response.status, data[:300])
    if response.status >= 400 and method != "HEAD":  # a HEAD answer has no body
        error = json.loads(data)["error"]
        assert {"message", "type", "param", "code"} <= error.keys(), data[:300]


AUTH = [("authorization", "Bearer mg-key"), ("content-type", "application/json")]


def test_fuzzed_bodies(target):
    @settings(max_examples=900, **SETTINGS)
    @given(bodies)
    def run(body: object) -> None:
        send(target, "POST", "/v1/chat/completions", json.dumps(body).encode(), AUTH)

    run()


@pytest.mark.parametrize("path, strategy", [("/v1/responses", responses_bodies), ("/v1/messages", messages_bodies)])
def test_fuzzed_native_bodies(target, path, strategy):
    @settings(max_examples=900, **SETTINGS)
    @given(strategy)
    def run(body: object) -> None:
        send(target, "POST", path, json.dumps(body).encode(), AUTH)

    run()


VALID = {
    "/v1/chat/completions": {"model": "faithful", "messages": [{"role": "user", "content": "Ibuprofen?"}],
                             "morphguard": {"context": PASSAGE}},
    "/v1/responses": {"model": "faithful", "input": "Ibuprofen?", "morphguard": {"context": PASSAGE}},
    "/v1/messages": {"model": "faithful", "max_tokens": 50, "messages": [{"role": "user", "content": "Ibuprofen?"}],
                     "morphguard": {"context": PASSAGE}},
}


@pytest.mark.parametrize("path", list(VALID))
def test_fuzzed_headers(target, path):
    valid = json.dumps(VALID[path]).encode()

    @settings(max_examples=500, **SETTINGS)
    @given(st.lists(st.tuples(header_names, header_text), max_size=6))
    def run(extra: list[tuple[str, str]]) -> None:
        send(target, "POST", path, valid, AUTH + extra)

    run()


def test_fuzzed_paths(target):
    @settings(max_examples=700, **SETTINGS)
    @given(st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]),
           st.lists(segments, max_size=6), st.booleans())
    def run(method: str, parts: list[str], lead: bool) -> None:
        path = ("/" if lead else "/v1/") + "/".join(parts)
        send(target, method, path, b"{}" if method in ("POST", "PUT", "PATCH") else None, AUTH)

    run()
    assert httpx.get(target + "/healthz", timeout=5).status_code == 200
