"""The OpenAI Responses API and the Anthropic Messages API through the proxy, driven by the official
`openai` and `anthropic` clients unchanged: checked like chat completions, the verdict in the response
and headers (and as its own stream event before the last), blocked answers as refusals the SDKs parse.
The scripted provider answers both APIs in their own shapes."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import httpx
import openai
import pytest

if TYPE_CHECKING:  # imported where it is used (tests/clients/conftest.py says why)
    import anthropic

PASSAGE = "Ibuprofen is contraindicated in the third trimester of pregnancy."
QUESTION = "Can pregnant women take ibuprofen for back pain?"
HALLUCINATED = "Ibuprofen is safe throughout pregnancy."


@pytest.fixture(scope="module")
def annotate_proxy(proxy_factory) -> str:
    return proxy_factory()


@pytest.fixture(scope="module")
def block_proxy(proxy_factory) -> str:
    return proxy_factory(policy={"profiles": {"general": {"action": "block", "topics": {}}}}, stream_mode="buffer")


def oai(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key="sk-client", max_retries=0, timeout=30)


def claude(base: str) -> anthropic.Anthropic:
    import anthropic

    return anthropic.Anthropic(base_url=base, api_key="sk-ant-client", max_retries=0, timeout=30)


def last_native(provider: str) -> dict:
    return httpx.get(provider.removesuffix("/v1") + "/_native", timeout=10).json()[-1]


# --- Responses -------------------------------------------------------------------------------------------

def test_responses_context_from_instructions_tags_is_checked_and_annotated(annotate_proxy):
    raw = oai(annotate_proxy).responses.with_raw_response.create(
        model="hallucinated", instructions=f"Answer from the documents.\n<documents>{PASSAGE}</documents>",
        input=QUESTION)
    response = raw.parse()
    verdict = response.model_extra["morphguard"]
    assert response.output_text == HALLUCINATED
    assert verdict["checked"] and verdict["flagged"] and verdict["context_source"] == "tags"
    assert raw.headers["x-morphguard-flagged"] == "true" and raw.headers["x-morphguard-action"] == "annotate"


def test_responses_explicit_context_never_reaches_the_provider(annotate_proxy, provider):
    response = oai(annotate_proxy).responses.create(model="faithful", input=[{"role": "user", "content": QUESTION}],
                                                    extra_body={"morphguard": {"context": PASSAGE}})
    assert response.model_extra["morphguard"]["context_source"] == "explicit"
    assert not response.model_extra["morphguard"]["flagged"]
    assert "morphguard" not in last_native(provider)["body"]


def test_responses_function_call_output_is_context(annotate_proxy):
    response = oai(annotate_proxy).responses.create(model="hallucinated", input=[
        {"role": "user", "content": QUESTION},
        {"type": "function_call", "call_id": "call_1", "name": "search", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": PASSAGE}])
    assert response.model_extra["morphguard"]["context_source"] == "tool"
    assert response.model_extra["morphguard"]["flagged"]


def test_responses_block_is_a_refusal(block_proxy):
    response = oai(block_proxy).responses.create(model="hallucinated", input=QUESTION,
                                                 extra_body={"morphguard": {"context": PASSAGE}})
    assert response.status == "completed" and response.incomplete_details is None
    refusal = response.output[0].content[0]
    assert refusal.type == "refusal" and "reliable answer" in refusal.refusal
    assert response.output_text == "" and response.model_extra["morphguard"]["action"] == "block"


def test_responses_stream_sends_the_verdict_before_completion(annotate_proxy):
    stream = oai(annotate_proxy).responses.create(model="hallucinated", input=QUESTION, stream=True,
                                                  extra_body={"morphguard": {"context": PASSAGE}})
    events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[-2:] == ["morphguard.verdict", "response.completed"]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == HALLUCINATED
    verdict = events[-2].model_extra["morphguard"]
    assert verdict["flagged"] and events[-1].response.model_extra["morphguard"] == verdict


def test_responses_stream_helper_and_async_client(annotate_proxy):
    with oai(annotate_proxy).responses.stream(model="hallucinated", input=QUESTION,
                                              extra_body={"morphguard": {"context": PASSAGE}}) as stream:
        final = stream.get_final_response()
    assert final.output_text == HALLUCINATED and final.model_extra["morphguard"]["flagged"]

    async def go():
        client = openai.AsyncOpenAI(base_url=annotate_proxy + "/v1", api_key="sk", max_retries=0, timeout=30)
        response = await client.responses.create(model="faithful", input=QUESTION,
                                                 extra_body={"morphguard": {"context": PASSAGE}})
        await client.close()
        return response
    response = asyncio.run(go())
    assert response.model_extra["morphguard"]["checked"] and not response.model_extra["morphguard"]["flagged"]


def test_responses_buffered_stream_can_block(block_proxy):
    events = list(oai(block_proxy).responses.create(model="hallucinated", input=QUESTION, stream=True,
                                                    extra_body={"morphguard": {"context": PASSAGE}}))
    assert [e.type for e in events][-2:] == ["morphguard.verdict", "response.completed"]
    assert not any(e.type == "response.output_text.delta" for e in events)  # nothing of the answer got out
    assert events[-1].response.output[0].content[0].type == "refusal"


def test_responses_provider_errors_pass_through(annotate_proxy):
    with pytest.raises(openai.BadRequestError) as raised:
        oai(annotate_proxy).responses.create(model="fail-400", input=QUESTION)
    assert raised.value.body["code"] == "model_not_found"


def test_responses_bad_input_is_a_clear_400(annotate_proxy):
    response = httpx.post(annotate_proxy + "/v1/responses", json={"model": "m", "input": 12}, timeout=10)
    assert response.status_code == 400 and response.json()["error"]["param"] == "input"
    response = httpx.post(annotate_proxy + "/v1/responses", json={"model": "m", "input": "q",
                                                                  "morphguard": {"context": 3}}, timeout=10)
    assert response.status_code == 400 and response.json()["error"]["param"] == "morphguard.context"


# --- Messages --------------------------------------------------------------------------------------------

def test_messages_document_blocks_are_context(annotate_proxy, provider):
    raw = claude(annotate_proxy).messages.with_raw_response.create(
        model="hallucinated", max_tokens=100, messages=[{"role": "user", "content": [
            {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": PASSAGE}},
            {"type": "text", "text": QUESTION}]}])
    message = raw.parse()
    assert message.content[0].text == HALLUCINATED
    verdict = message.model_extra["morphguard"]
    assert verdict["flagged"] and verdict["context_source"] == "tool"
    assert raw.headers["x-morphguard-flagged"] == "true"
    sent = last_native(provider)["headers"]  # the client's own key goes on, in the header it used
    assert "sk-ant-client" in (sent.get("x-api-key") or sent.get("authorization", ""))


def test_messages_tool_results_and_tagged_system_are_context(annotate_proxy):
    client = claude(annotate_proxy)
    message = client.messages.create(model="hallucinated", max_tokens=100, messages=[
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "search", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": PASSAGE}]}])
    assert message.model_extra["morphguard"]["context_source"] == "tool"
    tagged = client.messages.create(model="faithful", max_tokens=100, system=f"<context>{PASSAGE}</context>",
                                    messages=[{"role": "user", "content": QUESTION}])
    assert tagged.model_extra["morphguard"]["context_source"] == "tags"
    assert not tagged.model_extra["morphguard"]["flagged"]


def test_messages_block_is_a_refusal(block_proxy):
    message = claude(block_proxy).messages.create(model="hallucinated", max_tokens=100,
                                                  messages=[{"role": "user", "content": QUESTION}],
                                                  extra_body={"morphguard": {"context": PASSAGE}})
    assert message.stop_reason == "refusal" and "reliable answer" in message.content[0].text


def test_messages_stream_and_stream_helper(annotate_proxy):
    client = claude(annotate_proxy)
    events = list(client.messages.create(model="hallucinated", max_tokens=100, stream=True,
                                         messages=[{"role": "user", "content": QUESTION}],
                                         extra_body={"morphguard": {"context": PASSAGE}}))
    assert [e.type for e in events][-2:] == ["morphguard.verdict", "message_stop"]
    assert events[-2].model_extra["morphguard"]["flagged"]
    with client.messages.stream(model="hallucinated", max_tokens=100,
                                messages=[{"role": "user", "content": QUESTION}],
                                extra_body={"morphguard": {"context": PASSAGE}}) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == HALLUCINATED and final.content[0].text == HALLUCINATED


def test_messages_buffered_stream_can_block_and_async_client(block_proxy):
    import anthropic

    async def go():
        client = anthropic.AsyncAnthropic(base_url=block_proxy, api_key="sk", max_retries=0, timeout=30)
        async with client.messages.stream(model="hallucinated", max_tokens=100,
                                          messages=[{"role": "user", "content": QUESTION}],
                                          extra_body={"morphguard": {"context": PASSAGE}}) as stream:
            message = await stream.get_final_message()
        await client.close()
        return message
    message = asyncio.run(go())
    assert message.stop_reason == "refusal" and "reliable answer" in message.content[0].text


@pytest.mark.slow  # ten seconds or more of its own
def test_messages_to_their_own_upstream_with_the_proxys_key(proxy_factory, provider):
    base = proxy_factory(upstream={"api_key": "sk-openai-upstream"}, keys=["mg-key"],
                         anthropic={"base_url": provider, "api_key": "sk-ant-upstream"})
    body = {"model": "faithful", "max_tokens": 50, "messages": [{"role": "user", "content": QUESTION}],
            "morphguard": {"context": PASSAGE}}
    refused = httpx.post(base + "/v1/messages", json=body, headers={"x-api-key": "wrong"}, timeout=10)
    assert refused.status_code == 401
    answered = httpx.post(base + "/v1/messages", json=body, headers={"x-api-key": "mg-key",
                                                                     "anthropic-version": "2023-06-01"}, timeout=30)
    assert answered.status_code == 200 and answered.json()["morphguard"]["checked"]
    sent = last_native(provider)["headers"]
    assert sent["x-api-key"] == "sk-ant-upstream" and "authorization" not in sent
    assert sent["anthropic-version"] == "2023-06-01"


def test_responses_in_async_mode_are_queued_then_audited(proxy_factory):
    base = proxy_factory(mode="async", stream_mode="async")
    response = oai(base).responses.create(model="hallucinated", input=QUESTION,
                                          extra_body={"morphguard": {"context": PASSAGE}})
    assert response.model_extra["morphguard"]["reason"] == "queued"
    assert response.output_text == HALLUCINATED
    request_id = response.model_extra["morphguard"]["request_id"]
    folder = proxy_factory.folders[base]
    import sqlite3
    import time
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with sqlite3.connect(folder / "audit.db") as db:
            rows = db.execute("SELECT checked, flagged FROM decisions WHERE request_id = ?", (request_id,)).fetchall()
        if rows:
            break
        time.sleep(0.2)
    assert rows == [(1, 1)]
