"""LangChain: `ChatOpenAI` on chat completions and on the Responses API, `ChatAnthropic` on Messages (its only
API), each invoked, streamed and asked for structured output. A blocked answer is the safe message, and
structured output raises LangChain's `ModelRefusalError`. The verdict: `ChatOpenAI` drops the body field
(its `x-morphguard-*` headers reach `response_metadata` with `include_response_headers`), the capture on its
`http_client` has it; `ChatAnthropic` keeps it in `response_metadata["morphguard"]` when not streamed, and
takes no http client, so its streams carry no verdict to the app."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import pydantic
import pytest

from morphguard.integrations.clients import VerdictCapture
from tests.clients.conftest import HALLUCINATED, QUESTION, SAFE, SYSTEM

# LangChain is imported where it is used (tests/clients/conftest.py says why)
if TYPE_CHECKING:
    from langchain_anthropic import ChatAnthropic
    from langchain_openai import ChatOpenAI

MESSAGES = [("system", SYSTEM), ("user", QUESTION)]


class Dose(pydantic.BaseModel):
    safe: bool
    reason: str


def openai_chat(base: str, capture: VerdictCapture, **options: object) -> ChatOpenAI:
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(model="hallucinated", base_url=base + "/v1", api_key="sk-client", max_retries=0,
                      timeout=60, http_client=httpx.Client(event_hooks=capture.hooks), **options)


def anthropic_chat(base: str) -> ChatAnthropic:
    from langchain_anthropic import ChatAnthropic

    return ChatAnthropic(model="hallucinated", base_url=base, api_key="sk-ant-client", max_retries=0,
                         timeout=60, max_tokens=200)


def streamed_text(chat: ChatOpenAI | ChatAnthropic) -> str:
    whole = None
    for chunk in chat.stream(MESSAGES):
        whole = chunk if whole is None else whole + chunk
    assert whole is not None
    return whole.text


@pytest.mark.parametrize("responses_api", [False, True], ids=["chat", "responses"])
def test_chat_openai_block(block_proxy, responses_api):
    capture = VerdictCapture()
    chat = openai_chat(block_proxy, capture, use_responses_api=responses_api, include_response_headers=True)
    message = chat.invoke(MESSAGES)
    refusals = [b["refusal"] for b in message.content_blocks if b["type"] == "refusal"]
    assert refusals == [SAFE]
    if responses_api:  # the Responses refusal is a refusal part, no text
        assert message.text == ""
    else:
        assert message.text == SAFE and message.response_metadata["finish_reason"] == "stop"
        assert message.response_metadata["headers"]["x-morphguard-action"] == "block"
    assert capture.last["action"] == "block"


@pytest.mark.parametrize("responses_api", [False, True], ids=["chat", "responses"])
def test_chat_openai_structured_output_raises_the_refusal_error(block_proxy, responses_api):
    capture = VerdictCapture()
    chat = openai_chat(block_proxy, capture, use_responses_api=responses_api)
    from langchain_core.exceptions import ModelRefusalError

    with pytest.raises(ModelRefusalError) as raised:
        chat.with_structured_output(Dose).invoke(MESSAGES)
    assert SAFE in str(raised.value)
    assert capture.last["action"] == "block"


@pytest.mark.parametrize("responses_api", [False, True], ids=["chat", "responses"])
def test_chat_openai_stream_block(block_proxy, responses_api):
    capture = VerdictCapture()
    chat = openai_chat(block_proxy, capture, use_responses_api=responses_api)
    whole = None
    for chunk in chat.stream(MESSAGES):
        whole = chunk if whole is None else whole + chunk
    assert whole is not None
    if responses_api:  # the refusal events become a refusal block
        assert [b["refusal"] for b in whole.content_blocks if b["type"] == "refusal"] == [SAFE]
    else:  # chat chunks' refusal deltas are not kept by LangChain: the safe message is the text
        assert whole.text == SAFE
    assert HALLUCINATED not in whole.text and capture.last["action"] == "block"


@pytest.mark.parametrize("responses_api", [False, True], ids=["chat", "responses"])
def test_chat_openai_annotate_verdict(annotate_proxy, responses_api):
    capture = VerdictCapture()
    chat = openai_chat(annotate_proxy, capture, use_responses_api=responses_api)
    assert chat.invoke(MESSAGES).text == HALLUCINATED and capture.last["flagged"]
    assert streamed_text(chat) == HALLUCINATED and capture.last["flagged"]


def test_chat_anthropic_block(block_proxy):
    chat = anthropic_chat(block_proxy)
    message = chat.invoke(MESSAGES)
    assert message.text == SAFE and message.response_metadata["stop_reason"] == "refusal"
    assert [b["type"] for b in message.content_blocks] == ["text", "refusal"]
    assert message.response_metadata["morphguard"]["action"] == "block"
    whole = None
    for chunk in chat.stream(MESSAGES):
        whole = chunk if whole is None else whole + chunk
    assert whole is not None and whole.text == SAFE and whole.response_metadata["stop_reason"] == "refusal"
    assert "morphguard" not in whole.response_metadata  # dropped from streams by ChatAnthropic


def test_chat_anthropic_structured_output_raises_the_refusal_error(block_proxy):
    from langchain_core.exceptions import ModelRefusalError

    with pytest.raises(ModelRefusalError) as raised:
        anthropic_chat(block_proxy).with_structured_output(Dose).invoke(MESSAGES)
    assert SAFE in str(raised.value)


def test_chat_anthropic_annotate_verdict(annotate_proxy):
    chat = anthropic_chat(annotate_proxy)
    message = chat.invoke(MESSAGES)
    assert message.text == HALLUCINATED and message.response_metadata["morphguard"]["flagged"]
    assert streamed_text(chat) == HALLUCINATED
