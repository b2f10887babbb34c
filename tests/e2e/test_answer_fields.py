"""Every field that carries a model's words, on every API, streamed and not, is read by the check before any of it
reaches the client: the rows of the table in docs/concepts/streams.md ("Which fields are checked").

The proxy runs under uvicorn with its DEFAULT stream settings (`auto`: checked as it flows, held where the request
offers tools), a `block` profile and the `grounding` detector (no judge: its verdicts are known in advance). The
scripted provider answers in the field a row names: "<field>-answer" says the unsupported sentence there, and
"<field>-echo" the user's message, here the context's own sentence. Raw HTTP, since the bytes matter: nothing of
the unsupported sentence may be anywhere in what is sent."""

from __future__ import annotations

import json
from typing import NamedTuple

import httpx
import pytest

from tests.e2e.conftest import audit_row

PASSAGE = "Ibuprofen is contraindicated in the third trimester of pregnancy."
QUESTION = "Can pregnant women take ibuprofen for back pain?"
UNSUPPORTED_WORD = "throughout"  # of the unsupported answer, "Ibuprofen is safe throughout pregnancy."
SAFE = "Withheld: the sources do not support this answer."
PARAMETERS = {"type": "object", "properties": {"answer": {"type": "string"}}}
TOOLS = {
    "chat": [{"type": "function", "function": {"name": "answer", "parameters": PARAMETERS}}],
    "responses": [{"type": "function", "name": "answer", "parameters": PARAMETERS}],
    "messages": [{"name": "answer", "input_schema": PARAMETERS}],
}


class Row(NamedTuple):
    api: str  # chat, responses, messages
    field: str  # the scripted provider's name for the field ("" for the plain text)
    stream: bool

    @property
    def id(self) -> str:
        return f"{self.api}-{self.field or 'text'}-{'streamed' if self.stream else 'whole'}"


ROWS = [
    *(Row("chat", field, stream) for field in ("", "parts", "output-parts", "refusal", "audio", "tool", "function")
      for stream in (False, True)),
    Row("responses", "", False), Row("responses", "", True), Row("responses", "done-only", True),
    Row("responses", "item-only", True), Row("responses", "refusal", False), Row("responses", "refusal", True),
    Row("responses", "tool", False), Row("responses", "tool", True), Row("responses", "audio", True),
    Row("messages", "", False), Row("messages", "", True), Row("messages", "start-only", True),
    Row("messages", "tool", False), Row("messages", "tool", True),
]


@pytest.fixture(scope="module")
def guarded(proxy_factory) -> str:
    return proxy_factory(detector="grounding", policy={
        "safe_message": SAFE, "audit": {"store_text": "full"},
        "profiles": {"general": {"action": "block", "topics": {}}}})


def ask(base: str, row: Row, model: str, user: str) -> httpx.Response:
    """The row's request: the question (or, to an echo model, the answer it is to give) with the passage as
    context, offering a tool where the row's answer is a tool call."""
    body: dict = {"model": model, "stream": row.stream, "morphguard": {"context": PASSAGE}}
    if row.api == "chat":
        path = "/v1/chat/completions"
        body["messages"] = [{"role": "user", "content": user}]
    elif row.api == "responses":
        path = "/v1/responses"
        body["input"] = user
    else:
        path = "/v1/messages"
        body |= {"max_tokens": 100, "messages": [{"role": "user", "content": user}]}
    if row.field == "tool":
        body["tools"] = TOOLS[row.api]
    elif row.field == "function":
        body["functions"] = [TOOLS["chat"][0]["function"]]
    response = httpx.post(base + path, json=body, headers={"authorization": "Bearer sk-client"}, timeout=60)
    assert response.status_code == 200, response.text
    return response


def stream_mode(row: Row) -> str | None:
    """The stream mode the proxy's default (`auto`, under `block`) runs a row's stream in: as it flows, or buffered
    where the request offers tools whose calls are checked; a whole answer has none."""
    if not row.stream:
        return None
    return "buffer" if row.field in ("tool", "function") else "incremental"


def verdict(response: httpx.Response) -> dict:
    """The verdict of a whole answer, or the closing verdict of a stream (the sentences' own come before it)."""
    if response.headers["content-type"].startswith("application/json"):
        return response.json()["morphguard"]
    events = [json.loads(line[5:]) for line in response.text.splitlines()
              if line.startswith("data:") and line[5:].strip() != "[DONE]"]
    found = [e["morphguard"] for e in events if isinstance(e, dict) and "action" in e.get("morphguard", {})]
    assert found, response.text[:1000]
    return found[-1]



@pytest.mark.parametrize("row", ROWS, ids=[row.id for row in ROWS])
def test_an_unsupported_answer_in_any_field_is_blocked_before_any_of_it_is_sent(guarded, proxy_factory, row):
    response = ask(guarded, row, f"{row.field}-answer" if row.field else "hallucinated", QUESTION)
    assert response.headers.get("x-morphguard-stream") == stream_mode(row)  # no case falls back unseen
    found = verdict(response)
    assert found["checked"] is True and found["action"] == "block", found
    assert UNSUPPORTED_WORD not in response.text  # not in a delta, a whole part, an item or a tool call
    assert SAFE in response.text
    audited = audit_row(proxy_factory, guarded, found["request_id"])
    assert (audited["action"], audited["checked"], audited["flagged"]) == ("block", 1, 1), audited
    assert UNSUPPORTED_WORD in audited["answer"]  # the audit row keeps what the model said, from that field


@pytest.mark.parametrize("row", ROWS, ids=[row.id for row in ROWS])
def test_a_supported_answer_in_any_field_is_read_and_sent(guarded, proxy_factory, row):
    response = ask(guarded, row, f"{row.field}-echo" if row.field else "echo", PASSAGE)
    assert response.headers.get("x-morphguard-stream") == stream_mode(row)
    found = verdict(response)
    assert found["checked"] is True and found["action"] == "pass", found
    assert "contraindicated" in response.text
    audited = audit_row(proxy_factory, guarded, found["request_id"])
    assert audited["action"] == "pass" and "contraindicated" in audited["answer"], audited


IMAGE = "iVBORw0K"  # the image the scripted provider's "image-*" answers hold


def test_output_the_check_cannot_read_waits_for_the_verdict_of_a_stream_checked_as_it_flows(guarded, proxy_factory):
    """An image ahead of the text goes out only with a passing verdict: a block withholds it with the text."""
    row = Row("responses", "image-first", True)
    blocked = ask(guarded, row, "image-first-answer", QUESTION)
    assert blocked.headers["x-morphguard-stream"] == "incremental"
    assert verdict(blocked)["action"] == "block" and IMAGE not in blocked.text
    assert UNSUPPORTED_WORD not in blocked.text and SAFE in blocked.text

    passed = ask(guarded, row, "image-first-echo", PASSAGE)
    assert passed.headers["x-morphguard-stream"] == "incremental"
    found = verdict(passed)
    assert found["action"] == "pass" and "unreadable_output: image_generation_call" in found["reason"]
    assert IMAGE in passed.text and passed.text.index(IMAGE) < passed.text.index("contraindicated")  # in order


def test_a_whole_answer_is_decided_on_all_it_holds_though_its_text_passed_as_a_prefix(proxy_factory):
    """The text passes its prefix check; the image after it is output the check cannot read, which this policy
    withholds: the stream's verdict is a block, and the image never leaves."""
    strict = proxy_factory(detector="grounding", policy={
        "safe_message": SAFE, "unreadable_output": "block",
        "profiles": {"general": {"action": "block", "topics": {}}}})
    response = ask(strict, Row("responses", "image-last", True), "image-last-echo", PASSAGE + " ")
    assert response.headers["x-morphguard-stream"] == "incremental"
    found = verdict(response)
    assert found["action"] == "block" and "unreadable_output: image_generation_call" in found["reason"], found
    assert IMAGE not in response.text and SAFE in response.text
    audited = audit_row(proxy_factory, strict, found["request_id"])
    assert (audited["action"], audited["checked"]) == ("block", 1), audited


@pytest.mark.parametrize("mode", ["buffer", "passthrough"])
def test_a_responses_transcript_is_what_the_stream_check_reads_in_every_stream_mode(proxy_factory, mode):
    """The transcript is the spoken answer's words, and no response holds it: a buffered stream decides on it before
    any of it goes out; a stream passed through goes out as it comes, and its verdict is on those words."""
    base = proxy_factory(detector="grounding", stream_mode=mode, policy={
        "safe_message": SAFE, "audit": {"store_text": "full"},
        "profiles": {"general": {"action": "block", "topics": {}}}})
    response = ask(base, Row("responses", "audio", True), "audio-answer", QUESTION)
    assert response.headers["x-morphguard-stream"] == mode
    found = verdict(response)
    assert (found["checked"], found["flagged"]) == (True, True), found
    if mode == "buffer":
        assert found["action"] == "block" and UNSUPPORTED_WORD not in response.text and SAFE in response.text
    audited = audit_row(proxy_factory, base, found["request_id"])
    assert audited["checked"] == 1 and UNSUPPORTED_WORD in audited["answer"], audited
