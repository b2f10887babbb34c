"""Chat completions, Responses and Messages through the app in process, by the official `openai` and `anthropic`
clients over `httpx.ASGITransport`: plain, streamed and blocked, each leaving its one audit row."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import openai
import pytest

from tests.inprocess.conftest import BASE, InProcess

if TYPE_CHECKING:  # imported where it is used (tests/clients/conftest.py says why)
    import anthropic

pytestmark = pytest.mark.anyio

PASSAGE = "Ibuprofen is contraindicated in the third trimester of pregnancy."
QUESTION = "Can pregnant women take ibuprofen for back pain?"
HALLUCINATED = "Ibuprofen is safe throughout pregnancy."
CONTEXT = {"morphguard": {"context": PASSAGE}}


@pytest.fixture(scope="module")
async def annotating(in_process) -> InProcess:
    return await in_process()


@pytest.fixture(scope="module")
async def blocking(in_process) -> InProcess:
    return await in_process(policy={"profiles": {"general": {"action": "block", "topics": {}}}})


def oai(app: InProcess) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{BASE}/v1", api_key="sk-client", max_retries=0,
                              http_client=app.client)


def claude(app: InProcess) -> anthropic.AsyncAnthropic:
    import anthropic

    return anthropic.AsyncAnthropic(base_url=BASE, api_key="sk-ant-client", max_retries=0,
                                    http_client=app.client2)


def chat(**options: Any) -> dict[str, Any]:
    return {"model": "hallucinated", "messages": [{"role": "user", "content": QUESTION}], "extra_body": CONTEXT,
            **options}


# --- chat completions ------------------------------------------------------------------------------------

async def test_chat_is_checked_annotated_and_audited(annotating):
    raw = await oai(annotating).chat.completions.with_raw_response.create(**chat())
    completion = raw.parse()
    verdict = completion.model_extra["morphguard"]
    assert completion.choices[0].message.content == HALLUCINATED
    assert verdict["checked"] and verdict["flagged"] and verdict["action"] == "annotate"
    assert verdict["context_source"] == "explicit"
    assert raw.headers["x-morphguard-flagged"] == "true" and raw.headers["x-morphguard-action"] == "annotate"
    assert raw.headers["x-morphguard-request-id"] == verdict["request_id"]
    row = annotating.row(verdict["request_id"])
    assert (row["checked"], row["flagged"], row["action"], row["score"]) == (1, 1, "annotate", verdict["score"])


async def test_a_chat_stream_ends_with_its_verdict_and_its_row(annotating):
    chunks = [chunk async for chunk in await oai(annotating).chat.completions.create(**chat(stream=True))]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    verdict = next(c.model_extra["morphguard"] for c in chunks if "morphguard" in (c.model_extra or {}))
    assert text == HALLUCINATED and verdict["flagged"] and verdict["action"] == "annotate"
    row = annotating.row(verdict["request_id"])
    assert (row["checked"], row["flagged"], row["action"]) == (1, 1, "annotate")


async def test_a_blocked_chat_answer_is_a_refusal_and_its_row_says_block(blocking):
    completion = await oai(blocking).chat.completions.create(**chat())
    message, verdict = completion.choices[0].message, completion.model_extra["morphguard"]
    assert message.refusal and message.content.startswith("I can't give a reliable answer")
    assert verdict["action"] == "block" and blocking.row(verdict["request_id"])["action"] == "block"


async def test_a_blocked_chat_stream_gives_away_none_of_the_answer(blocking):
    chunks = [chunk async for chunk in await oai(blocking).chat.completions.create(**chat(stream=True))]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    verdict = next(c.model_extra["morphguard"] for c in chunks if "morphguard" in (c.model_extra or {}))
    assert HALLUCINATED not in text and verdict["action"] == "block"
    assert blocking.row(verdict["request_id"])["action"] == "block"


async def test_a_faithful_chat_answer_passes_a_blocking_profile(blocking):
    completion = await oai(blocking).chat.completions.create(**chat(model="faithful"))
    verdict = completion.model_extra["morphguard"]
    assert completion.choices[0].message.content == PASSAGE
    assert verdict["checked"] and not verdict["flagged"] and verdict["action"] == "pass"


# --- Responses -------------------------------------------------------------------------------------------

async def test_a_response_is_checked_with_context_from_its_instructions(annotating):
    raw = await oai(annotating).responses.with_raw_response.create(
        model="hallucinated", instructions=f"Answer from the documents.\n<documents>{PASSAGE}</documents>",
        input=QUESTION)
    response = raw.parse()
    verdict = response.model_extra["morphguard"]
    assert response.output_text == HALLUCINATED
    assert verdict["flagged"] and verdict["context_source"] == "tags"
    assert raw.headers["x-morphguard-action"] == "annotate"
    assert annotating.row(verdict["request_id"])["flagged"] == 1


async def test_a_response_stream_sends_its_verdict_before_completion(annotating):
    events = [e async for e in await oai(annotating).responses.create(model="hallucinated", input=QUESTION,
                                                                     stream=True, extra_body=CONTEXT)]
    assert [e.type for e in events][-2:] == ["morphguard.verdict", "response.completed"]
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == HALLUCINATED
    verdict = events[-2].model_extra["morphguard"]
    assert verdict["flagged"] and events[-1].response.model_extra["morphguard"] == verdict
    assert annotating.row(verdict["request_id"])["flagged"] == 1


async def test_a_blocked_response_is_a_refusal_streamed_or_not(blocking):
    response = await oai(blocking).responses.create(model="hallucinated", input=QUESTION, extra_body=CONTEXT)
    assert response.output[0].content[0].type == "refusal" and response.output_text == ""
    assert blocking.row(response.model_extra["morphguard"]["request_id"])["action"] == "block"
    events = [e async for e in await oai(blocking).responses.create(model="hallucinated", input=QUESTION,
                                                                   stream=True, extra_body=CONTEXT)]
    assert "safe" not in "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert events[-1].type == "response.completed"
    assert events[-1].response.output[-1].content[-1].type == "refusal"


# --- Messages --------------------------------------------------------------------------------------------

async def test_a_message_is_checked_with_its_documents_as_context(annotating):
    raw = await claude(annotating).messages.with_raw_response.create(
        model="hallucinated", max_tokens=100, messages=[{"role": "user", "content": [
            {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": PASSAGE}},
            {"type": "text", "text": QUESTION}]}])
    message = await raw.parse()
    verdict = message.model_extra["morphguard"]
    assert message.content[0].text == HALLUCINATED
    assert verdict["flagged"] and verdict["context_source"] == "tool"
    assert raw.headers["x-morphguard-flagged"] == "true"
    assert annotating.row(verdict["request_id"])["flagged"] == 1


async def test_a_message_stream_sends_its_verdict_before_it_stops(annotating):
    events = [e async for e in await claude(annotating).messages.create(
        model="hallucinated", max_tokens=100, stream=True, messages=[{"role": "user", "content": QUESTION}],
        extra_body=CONTEXT)]
    assert [e.type for e in events][-2:] == ["morphguard.verdict", "message_stop"]
    verdict = events[-2].model_extra["morphguard"]
    assert verdict["flagged"] and annotating.row(verdict["request_id"])["flagged"] == 1


async def test_a_blocked_message_is_a_refusal_streamed_or_not(blocking):
    client = claude(blocking)
    message = await client.messages.create(model="hallucinated", max_tokens=100,
                                           messages=[{"role": "user", "content": QUESTION}], extra_body=CONTEXT)
    assert message.stop_reason == "refusal" and "reliable answer" in message.content[0].text
    assert blocking.row(message.model_extra["morphguard"]["request_id"])["action"] == "block"
    async with client.messages.stream(model="hallucinated", max_tokens=100,
                                      messages=[{"role": "user", "content": QUESTION}],
                                      extra_body=CONTEXT) as stream:
        streamed = await stream.get_final_message()
    assert streamed.stop_reason == "refusal" and HALLUCINATED not in "".join(
        block.text for block in streamed.content if block.type == "text")
