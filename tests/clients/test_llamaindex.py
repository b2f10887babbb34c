"""LlamaIndex's `OpenAI` LLM (chat completions) and `OpenAIResponses` (the Responses API), streamed and not:
a blocked answer is the safe message (or, on Responses, a refusal in `additional_kwargs`); the verdict is on
the raw completion the response keeps (`response.raw`), and the capture has it for streams."""

from __future__ import annotations

import httpx
from llama_index.core.llms import ChatMessage
from llama_index.llms.openai import OpenAI, OpenAIResponses

from morphguard.clients import VerdictCapture, verdict_of
from tests.clients.conftest import HALLUCINATED, QUESTION, SAFE, SYSTEM

MESSAGES = [ChatMessage(role="system", content=SYSTEM), ChatMessage(role="user", content=QUESTION)]


def llm(kind: type[OpenAI] | type[OpenAIResponses], base: str, capture: VerdictCapture) -> OpenAI | OpenAIResponses:
    # LlamaIndex knows OpenAI's model names only; the scripted provider picks its answer by the model it is sent
    return kind(model="gpt-4o", api_base=base + "/v1", api_key="sk-client", max_retries=0, timeout=60,
                http_client=httpx.Client(event_hooks=capture.hooks),
                additional_kwargs={"model": "hallucinated"})


def test_openai_chat_block_and_verdict(block_proxy):
    capture = VerdictCapture()
    model = llm(OpenAI, block_proxy, capture)
    response = model.chat(MESSAGES)
    assert response.message.content == SAFE and verdict_of(response.raw)["action"] == "block"
    last = list(model.stream_chat(MESSAGES))[-1]
    assert last.message.content == SAFE
    assert capture.last["action"] == "block"


def test_openai_chat_annotate_verdict(annotate_proxy):
    capture = VerdictCapture()
    model = llm(OpenAI, annotate_proxy, capture)
    response = model.chat(MESSAGES)
    assert response.message.content == HALLUCINATED and verdict_of(response.raw)["flagged"]
    last = list(model.stream_chat(MESSAGES))[-1]
    assert last.message.content == HALLUCINATED and capture.last["flagged"]


def test_openai_responses_block_is_a_refusal(block_proxy):
    capture = VerdictCapture()
    model = llm(OpenAIResponses, block_proxy, capture)
    response = model.chat(MESSAGES)
    assert not response.message.content and response.additional_kwargs["refusal"] == SAFE
    assert verdict_of(response.raw)["action"] == "block"
    last = list(model.stream_chat(MESSAGES))[-1]
    assert not last.message.content
    assert verdict_of(last.raw)["action"] == "block" and capture.last["action"] == "block"


def test_openai_responses_annotate_verdict(annotate_proxy):
    capture = VerdictCapture()
    model = llm(OpenAIResponses, annotate_proxy, capture)
    response = model.chat(MESSAGES)
    assert response.message.content == HALLUCINATED and verdict_of(response.raw)["flagged"]
