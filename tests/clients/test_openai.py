"""The `openai` client: chat completions (`create`, `parse()`, the `.stream()` helper) and the Responses API
(`create`, `parse()`, `.stream()`), streamed and not. A blocked answer is a refusal the SDK hands back (never
a content-filter exception); the verdict is the `morphguard` field, or, where a helper drops it, the capture's."""

from __future__ import annotations

import httpx
import openai
import pydantic
import pytest

from morphguard.integrations.clients import VerdictCapture, verdict_of
from tests.clients.conftest import HALLUCINATED, QUESTION, SAFE, SYSTEM


class Dose(pydantic.BaseModel):
    safe: bool
    reason: str


def oai(base: str, capture: VerdictCapture | None = None) -> openai.OpenAI:
    http = httpx.Client(event_hooks=capture.hooks) if capture else None
    return openai.OpenAI(base_url=base + "/v1", api_key="sk-client", max_retries=0, timeout=60, http_client=http)


CHAT = {"model": "hallucinated", "messages": [{"role": "system", "content": SYSTEM},
                                             {"role": "user", "content": QUESTION}]}
RESPONSES = {"model": "hallucinated", "instructions": SYSTEM, "input": QUESTION}


# --- chat completions ------------------------------------------------------------------------------------

def test_chat_block_is_a_refusal_with_the_safe_message(block_proxy):
    raw = oai(block_proxy).chat.completions.with_raw_response.create(**CHAT)
    choice = raw.parse().choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.refusal == SAFE and choice.message.content == SAFE
    assert verdict_of(raw.parse())["action"] == "block" and raw.headers["x-morphguard-action"] == "block"


def test_chat_annotate_verdict_is_the_body_field(annotate_proxy):
    completion = oai(annotate_proxy).chat.completions.create(**CHAT)
    assert completion.choices[0].message.content == HALLUCINATED
    verdict = verdict_of(completion)
    assert verdict["flagged"] and verdict["action"] == "annotate"


def test_chat_parse_block_leaves_parsed_empty_and_says_refusal(block_proxy):
    completion = oai(block_proxy).chat.completions.parse(**CHAT, response_format=Dose)
    message = completion.choices[0].message
    assert message.parsed is None and message.refusal == SAFE
    assert verdict_of(completion)["action"] == "block"


def test_chat_stream_block_sends_the_refusal_and_the_verdict_chunk(block_proxy):
    chunks = list(oai(block_proxy).chat.completions.create(**CHAT, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.refusal or "" for d in deltas) == SAFE
    assert "".join(d.content or "" for d in deltas) == SAFE
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert verdict_of(chunks[-1])["action"] == "block"


def test_chat_stream_helper_block_gives_the_refusal_and_capture_the_verdict(block_proxy):
    capture = VerdictCapture()
    with oai(block_proxy, capture).chat.completions.stream(**CHAT, response_format=Dose) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_completion()
    assert "refusal.done" in events
    assert final.choices[0].message.refusal == SAFE and final.choices[0].message.parsed is None
    assert verdict_of(final) is None  # the helper assembles chunks and drops the verdict chunk's field
    assert capture.last["action"] == "block"


def test_chat_stream_helper_annotate_verdict_through_the_capture(annotate_proxy):
    capture = VerdictCapture()
    with oai(annotate_proxy, capture).chat.completions.stream(**CHAT) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].message.content == HALLUCINATED
    assert capture.last["flagged"] and capture.of(capture.last["request_id"]) == capture.last


# --- Responses -------------------------------------------------------------------------------------------

def test_responses_block_is_a_completed_refusal(block_proxy):
    response = oai(block_proxy).responses.create(**RESPONSES)
    assert response.status == "completed" and response.incomplete_details is None
    part = response.output[0].content[0]
    assert part.type == "refusal" and part.refusal == SAFE and response.output_text == ""
    assert verdict_of(response)["action"] == "block"


def test_responses_parse_block_leaves_output_parsed_empty(block_proxy):
    response = oai(block_proxy).responses.parse(**RESPONSES, text_format=Dose)
    assert response.output_parsed is None and response.output[0].content[0].refusal == SAFE


def test_responses_stream_block_sends_refusal_events_then_completes(block_proxy):
    events = list(oai(block_proxy).responses.create(**RESPONSES, stream=True))
    kinds = [e.type for e in events]
    assert kinds[-2:] == ["morphguard.verdict", "response.completed"]
    assert "response.refusal.done" in kinds and "response.output_text.delta" not in kinds
    assert "".join(e.delta for e in events if e.type == "response.refusal.delta") == SAFE
    assert verdict_of(events[-2])["action"] == "block" and verdict_of(events[-1])["action"] == "block"


def test_responses_stream_helper_block_and_annotate(block_proxy, annotate_proxy):
    with oai(block_proxy).responses.stream(**RESPONSES) as stream:
        final = stream.get_final_response()
    assert final.output[0].content[0].refusal == SAFE and verdict_of(final)["action"] == "block"
    with oai(annotate_proxy).responses.stream(**RESPONSES) as stream:
        final = stream.get_final_response()
    assert final.output_text == HALLUCINATED and verdict_of(final)["flagged"]


def test_refusal_is_not_a_protocol_error_for_the_async_client(block_proxy):
    import asyncio

    async def go() -> tuple[openai.types.chat.ParsedChatCompletion[Dose], openai.types.responses.Response]:
        async with openai.AsyncOpenAI(base_url=block_proxy + "/v1", api_key="sk", max_retries=0,
                                      timeout=60) as client:
            return (await client.chat.completions.parse(**CHAT, response_format=Dose),
                    await client.responses.create(**RESPONSES))

    chat, response = asyncio.run(go())
    assert chat.choices[0].message.refusal == SAFE and response.output[0].content[0].refusal == SAFE


@pytest.mark.parametrize("stream", [False, True])
def test_a_faithful_answer_passes_unchanged(block_proxy, stream):
    body = {**CHAT, "model": "faithful"}
    if stream:
        chunks = list(oai(block_proxy).chat.completions.create(**body, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        refusal = "".join(c.choices[0].delta.refusal or "" for c in chunks if c.choices)
    else:
        message = oai(block_proxy).chat.completions.create(**body).choices[0].message
        text, refusal = message.content, message.refusal or ""
    assert "contraindicated" in text and refusal == ""
