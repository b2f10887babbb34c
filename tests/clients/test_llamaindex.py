"""LlamaIndex's `OpenAI` LLM (chat completions) and `OpenAIResponses` (the Responses API), streamed and not:
a blocked answer is the safe message (or, on Responses, a refusal in `additional_kwargs`); the verdict is on
the raw completion the response keeps (`response.raw`), and the capture has it for streams."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx
import pytest

from morphguard.integrations.clients import VerdictCapture, verdict_of
from tests.clients.conftest import HALLUCINATED, QUESTION, SAFE, SYSTEM

# LlamaIndex is imported where it is used (tests/clients/conftest.py says why)
if TYPE_CHECKING:
    from llama_index.llms.openai import OpenAI, OpenAIResponses


@pytest.fixture(scope="module")
def messages() -> list[Any]:
    from llama_index.core.llms import ChatMessage

    return [ChatMessage(role="system", content=SYSTEM), ChatMessage(role="user", content=QUESTION)]


def llm(api: str, base: str, capture: VerdictCapture) -> OpenAI | OpenAIResponses:
    from llama_index.llms.openai import OpenAI, OpenAIResponses

    kind = OpenAI if api == "chat" else OpenAIResponses
    # LlamaIndex knows OpenAI's model names only; the scripted provider picks its answer by the model it is sent
    return kind(model="gpt-4o", api_base=base + "/v1", api_key="sk-client", max_retries=0, timeout=60,
                http_client=httpx.Client(event_hooks=capture.hooks),
                additional_kwargs={"model": "hallucinated"})


def test_openai_chat_block_and_verdict(block_proxy, messages):
    capture = VerdictCapture()
    model = llm("chat", block_proxy, capture)
    response = model.chat(messages)
    assert response.message.content == SAFE and verdict_of(response.raw)["action"] == "block"
    last = list(model.stream_chat(messages))[-1]
    assert last.message.content == SAFE
    assert capture.last["action"] == "block"


def test_openai_chat_annotate_verdict(annotate_proxy, messages):
    capture = VerdictCapture()
    model = llm("chat", annotate_proxy, capture)
    response = model.chat(messages)
    assert response.message.content == HALLUCINATED and verdict_of(response.raw)["flagged"]
    last = list(model.stream_chat(messages))[-1]
    assert last.message.content == HALLUCINATED and capture.last["flagged"]


def test_openai_responses_block_is_a_refusal(block_proxy, messages):
    capture = VerdictCapture()
    model = llm("responses", block_proxy, capture)
    response = model.chat(messages)
    assert not response.message.content and response.additional_kwargs["refusal"] == SAFE
    assert verdict_of(response.raw)["action"] == "block"
    last = list(model.stream_chat(messages))[-1]
    assert not last.message.content
    assert verdict_of(last.raw)["action"] == "block" and capture.last["action"] == "block"


def test_openai_responses_annotate_verdict(annotate_proxy, messages):
    capture = VerdictCapture()
    model = llm("responses", annotate_proxy, capture)
    response = model.chat(messages)
    assert response.message.content == HALLUCINATED and verdict_of(response.raw)["flagged"]
