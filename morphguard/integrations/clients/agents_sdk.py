"""The verdict on the OpenAI Agents SDK's `RunResult`, as an output guardrail.

The SDK's models drop the proxy's `morphguard` field; give its OpenAI client an httpx client hooked by a
`VerdictCapture` and add this guardrail to the agent. The verdict of the answer that became the final
output is then `result.output_guardrail_results[0].output.output_info`; with `trip_when_flagged`, a flagged
answer (a profile that annotates rather than blocks) raises `OutputGuardrailTripwireTriggered`.

    capture = VerdictCapture()
    client = AsyncOpenAI(base_url=..., http_client=httpx.AsyncClient(event_hooks=capture.async_hooks))
    agent = Agent(name="...", model=OpenAIResponsesModel("gpt-5", client),
                  output_guardrails=[verdict_guardrail(capture)])

A blocked answer never reaches the guardrail: the SDK raises `ModelRefusalError` with the safe message.
One capture serves one conversation at a time (its latest verdict is the final answer's).
"""

from __future__ import annotations

from typing import Any

from agents import Agent, GuardrailFunctionOutput, OutputGuardrail, RunContextWrapper

from morphguard.integrations.clients.capture import VerdictCapture


def verdict_guardrail(capture: VerdictCapture, *, trip_when_flagged: bool = False) -> OutputGuardrail[Any]:
    def morphguard(context: RunContextWrapper[Any], agent: Agent[Any], output: Any) -> GuardrailFunctionOutput:
        verdict = capture.last
        flagged = bool(verdict and verdict.get("flagged"))
        return GuardrailFunctionOutput(output_info=verdict, tripwire_triggered=trip_when_flagged and flagged)

    return OutputGuardrail(guardrail_function=morphguard, name="morphguard")
