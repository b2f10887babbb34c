"""What reaches the client of an answer, and where the proxy sends a client's request: a blocked answer leaves
nothing of itself on any API, answers outside the text (tool calls, refusals, transcripts) are checked, a
truncated stream is never recorded as checked, and a litellm route's key goes only where the route says.

Raw HTTP (httpx) where the bytes matter: a blocked sentence must not appear anywhere in what is sent."""

from __future__ import annotations

import json
import sqlite3

import httpx
import openai
import pytest

PASSAGE = "Ibuprofen is contraindicated in the third trimester of pregnancy."
QUESTION = "Can pregnant women take ibuprofen for back pain?"
HALLUCINATED = "Ibuprofen is safe throughout pregnancy."
SAFE = "Withheld by policy."
ROUTE_KEY = "sk-route-secret-123"


@pytest.fixture(scope="module")
def annotate_proxy(proxy_factory) -> str:
    return proxy_factory()


@pytest.fixture(scope="module")
def litellm_proxy(proxy_factory, provider) -> str:
    return proxy_factory(litellm_routes=[{"prefix": "openai/", "api_base": provider, "api_key": ROUTE_KEY}])


@pytest.fixture(scope="module")
def block_proxy(proxy_factory) -> str:
    return proxy_factory(policy={"profiles": {"general": {"action": "block", "topics": {}}}, "safe_message": SAFE,
                                 "audit": {"store_text": "full"}}, stream_mode="buffer")


def chat(model: str, **extra: object) -> tuple[str, dict]:
    return "/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": QUESTION}],
                                    "morphguard": {"context": PASSAGE}, **extra}


def responses(model: str, **extra: object) -> tuple[str, dict]:
    return "/v1/responses", {"model": model, "input": QUESTION, "morphguard": {"context": PASSAGE}, **extra}


def messages(model: str, **extra: object) -> tuple[str, dict]:
    return "/v1/messages", {"model": model, "max_tokens": 100, "messages": [{"role": "user", "content": QUESTION}],
                            "morphguard": {"context": PASSAGE}, **extra}


def post(base: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(base + path, json=body, headers={"authorization": "Bearer sk-client"}, timeout=60)


def verdict(response: httpx.Response) -> dict:
    """The verdict of a plain response, or of a stream (its `morphguard` chunk or event)."""
    if response.headers["content-type"].startswith("application/json"):
        return response.json()["morphguard"]
    for line in response.text.splitlines():
        if line.startswith("data:") and '"morphguard"' in line:
            data = json.loads(line[5:])
            return data["morphguard"]
    raise AssertionError(f"no verdict in {response.text[:500]}")


def audit_rows(proxy_factory, base: str) -> list[dict]:
    with sqlite3.connect(proxy_factory.folders[base] / "audit.db") as db:
        db.row_factory = sqlite3.Row
        return [dict(r) for r in db.execute("SELECT * FROM decisions ORDER BY id")]


@pytest.mark.parametrize("request_of", [
    chat("hallucinated", logprobs=True, top_logprobs=2), chat("hallucinated", stream=True),
    responses("hallucinated"), responses("hallucinated", stream=True),
    messages("hallucinated"), messages("hallucinated", stream=True),
], ids=["chat", "chat-stream", "responses", "responses-stream", "messages", "messages-stream"])
def test_a_blocked_answer_leaves_nothing_of_itself(block_proxy, request_of):
    path, body = request_of
    response = post(block_proxy, path, body)
    assert response.status_code == 200, response.text
    found = verdict(response)
    assert found["action"] == "block" and found["factoids"], found
    assert all("text" not in f and f["start"] is not None for f in found["factoids"])  # where and how bad, not what
    assert SAFE in response.text
    assert "safe throughout" not in response.text  # not in the answer, the verdict, logprobs or stream events


def test_a_blocked_chat_answer_has_no_logprobs_and_more_choices_are_refused(block_proxy):
    path, body = chat("hallucinated", logprobs=True)
    choice = post(block_proxy, path, body).json()["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": SAFE, "refusal": SAFE} and choice["logprobs"] is None
    assert choice["finish_reason"] == "stop"
    with pytest.raises(openai.BadRequestError) as err:
        openai.OpenAI(base_url=block_proxy + "/v1", api_key="sk-client", max_retries=0).chat.completions.create(
            model="hallucinated", n=2, messages=[{"role": "user", "content": QUESTION}],
            extra_body={"morphguard": {"context": PASSAGE}})
    assert err.value.body["param"] == "n"


@pytest.mark.parametrize("request_of", [
    chat("tool-answer"), chat("tool-answer", stream=True), chat("refusal-answer"), chat("audio-answer"),
    responses("tool-answer"), responses("tool-answer", stream=True), messages("tool-answer"),
    messages("tool-answer", stream=True),
], ids=["chat-tool", "chat-tool-stream", "chat-refusal", "chat-audio", "responses-function-call",
        "responses-function-call-stream", "messages-tool-use", "messages-tool-use-stream"])
def test_answers_outside_the_text_are_checked(block_proxy, request_of):
    path, body = request_of
    response = post(block_proxy, path, body)
    assert response.status_code == 200, response.text
    found = verdict(response)
    assert found["checked"] and found["flagged"] and found["action"] == "block", found
    assert "safe throughout" not in response.text
    if path == "/v1/chat/completions" and not body.get("stream"):
        assert response.json()["choices"][0]["message"] == {"role": "assistant", "content": SAFE, "refusal": SAFE}


@pytest.mark.slow  # ten seconds or more of its own
def test_policy_names_what_happens_to_tool_calls_and_output_it_cannot_read(proxy_factory):
    lenient = proxy_factory(policy={"profiles": {"general": {"action": "block", "topics": {}}},
                                    "tool_calls": "record"})
    found = verdict(post(lenient, *chat("tool-answer")))
    assert not found["checked"] and found["action"] == "pass" and "tool_calls_unchecked" in found["reason"]

    image = verdict(post(lenient, *responses("image-answer")))
    assert image["action"] == "pass" and "unreadable_output: image_generation_call" in image["reason"]
    strict = proxy_factory(policy={"profiles": {"general": {"action": "block", "topics": {}}},
                                   "unreadable_output": "block"})
    response = post(strict, *responses("image-answer"))
    assert verdict(response)["action"] == "block" and response.json()["output"][0]["content"][0]["type"] == "refusal"
    assert "iVBORw0K" not in response.text  # the image is withheld with the rest


def test_a_blocked_response_cannot_be_repeated_through_previous_response_id(block_proxy):
    client = openai.OpenAI(base_url=block_proxy + "/v1", api_key="sk-client", max_retries=0, timeout=60)
    blocked = client.responses.create(model="hallucinated", input=QUESTION,
                                      extra_body={"morphguard": {"context": PASSAGE}})
    assert blocked.output[0].content[0].type == "refusal" and blocked.id.startswith("resp_blocked_")
    with pytest.raises(openai.BadRequestError) as err:  # no context in this turn: it would not be checked
        client.responses.create(model="faithful", input="Please repeat your previous answer word for word.",
                                previous_response_id=blocked.id)
    assert err.value.body["param"] == "previous_response_id"


@pytest.mark.parametrize("request_of", [responses("truncated", stream=True), messages("truncated", stream=True)],
                         ids=["responses", "messages"])
def test_a_truncated_native_stream_ends_in_an_error_and_is_not_recorded_as_checked(proxy_factory, annotate_proxy,
                                                                                   request_of):
    base = annotate_proxy
    path, body = request_of
    response = post(base, path, body)
    events = [line for line in response.text.splitlines() if line.startswith("data:")]
    assert json.loads(events[-1][5:])["type"] == "error", events[-3:]
    assert '"morphguard"' not in response.text  # no verdict: nothing was checked
    row = audit_rows(proxy_factory, base)[-1]
    assert not row["checked"] and row["reason"] == "upstream_stream_broken", row


@pytest.mark.parametrize("extra", [
    {"base_url": "ATTACKER"}, {"api_base": "ATTACKER"}, {"api_key": "sk-mine", "base_url": "ATTACKER"},
    {"fallbacks": [{"model": "openai/hallucinated", "api_base": "ATTACKER"}]},
    {"extra_headers": {"x-forwarded-host": "ATTACKER"}}, {"metadata": {"api_base": "ATTACKER"}},
], ids=["base_url", "api_base", "api_key", "fallbacks", "extra_headers", "metadata"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_client_cannot_send_a_litellm_routes_key_where_it_likes(proxy_factory, litellm_proxy, attacker, extra,
                                                                   stream):
    port, seen = attacker
    base = litellm_proxy
    before = len(seen)
    fields = json.loads(json.dumps(extra).replace("ATTACKER", f"http://127.0.0.1:{port}/v1"))
    path, body = chat("openai/hallucinated", stream=stream, **fields)
    response = post(base, path, body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == next(iter(extra))
    assert seen[before:] == []
    assert audit_rows(proxy_factory, base)[-1]["reason"] == "invalid_request"


@pytest.mark.parametrize("request_of", [chat("faithful"), chat("faithful", stream=True), responses("faithful"),
                                        messages("faithful")], ids=["chat", "chat-stream", "responses", "messages"])
def test_a_proxied_response_has_one_date_and_one_server_header(annotate_proxy, request_of):
    path, body = request_of
    response = post(annotate_proxy, path, body)
    names = [name.lower() for name, _ in response.headers.multi_items()]
    assert names.count("date") == 1 and names.count("server") == 1, response.headers


@pytest.mark.parametrize("request_of", [responses("hallucinated", stream=True), messages("hallucinated", stream=True)],
                         ids=["responses", "messages"])
def test_a_blocked_buffered_stream_ends_with_the_verdict_in_its_last_event(block_proxy, request_of):
    path, body = request_of
    lines = [line for line in post(block_proxy, path, body).text.splitlines() if line.startswith("data:")]
    last = json.loads(lines[-1][5:])
    verdict = last["response"]["morphguard"] if path == "/v1/responses" else last["morphguard"]
    assert last["type"] in ("response.completed", "message_stop") and verdict["action"] == "block"
