"""The OpenAI Agents SDK on its Responses model (the default) and its chat completions model, run and
streamed: a blocked answer raises the SDK's `ModelRefusalError` carrying the safe message (never a
`ModelBehaviorError`); the verdict reaches `RunResult` through `verdict_guardrail`."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from openai import AsyncOpenAI

from morphguard.integrations.clients import VerdictCapture
from tests.clients.conftest import HALLUCINATED, QUESTION, SAFE, SYSTEM

# The SDK is imported where it is used (tests/clients/conftest.py says why)
if TYPE_CHECKING:
    from agents import Agent

APIS = ["responses", "chat"]


def agent(base: str, api: str, capture: VerdictCapture, **options: Any) -> Agent[Any]:
    from agents import Agent, OpenAIChatCompletionsModel, OpenAIResponsesModel, set_tracing_disabled

    from morphguard.integrations.clients.agents_sdk import verdict_guardrail

    set_tracing_disabled(True)  # the SDK would send its traces to OpenAI
    model = OpenAIResponsesModel if api == "responses" else OpenAIChatCompletionsModel
    client = AsyncOpenAI(base_url=base + "/v1", api_key="sk-client", max_retries=0, timeout=60,
                         http_client=httpx.AsyncClient(event_hooks=capture.async_hooks))
    return Agent(name="nurse", instructions=SYSTEM, model=model(model="hallucinated", openai_client=client),
                 output_guardrails=[verdict_guardrail(capture, **options)])


async def streamed(agent: Agent[Any]) -> Any:
    from agents import Runner

    result = Runner.run_streamed(agent, QUESTION)
    async for _ in result.stream_events():
        pass
    return result


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("stream", [False, True], ids=["run", "streamed"])
def test_block_raises_the_refusal_error(block_proxy, api, stream):
    from agents import ModelRefusalError, Runner

    capture = VerdictCapture()
    nurse = agent(block_proxy, api, capture)
    with pytest.raises(ModelRefusalError) as raised:
        asyncio.run(streamed(nurse) if stream else Runner.run(nurse, QUESTION))
    assert raised.value.refusal == SAFE and capture.last["action"] == "block"


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("stream", [False, True], ids=["run", "streamed"])
def test_annotate_verdict_is_on_the_run_result(annotate_proxy, api, stream):
    from agents import Runner

    capture = VerdictCapture()
    nurse = agent(annotate_proxy, api, capture)
    result = asyncio.run(streamed(nurse) if stream else Runner.run(nurse, QUESTION))
    assert result.final_output == HALLUCINATED
    verdict = result.output_guardrail_results[0].output.output_info
    assert verdict["flagged"] and verdict["action"] == "annotate"


def test_guardrail_can_trip_on_a_flagged_answer(annotate_proxy):
    from agents import OutputGuardrailTripwireTriggered, Runner

    capture = VerdictCapture()
    with pytest.raises(OutputGuardrailTripwireTriggered) as raised:
        asyncio.run(Runner.run(agent(annotate_proxy, "responses", capture, trip_when_flagged=True), QUESTION))
    assert raised.value.guardrail_result.output.output_info["flagged"]


@pytest.mark.parametrize("api", APIS)
def test_the_sdk_refusal_handler_makes_the_safe_message_the_final_output(block_proxy, api):
    from agents import Runner

    capture = VerdictCapture()
    result = asyncio.run(Runner.run(agent(block_proxy, api, capture), QUESTION,
                                    error_handlers={"model_refusal": lambda data: data.error.refusal}))
    assert result.final_output == SAFE and capture.last["action"] == "block"
