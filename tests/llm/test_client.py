"""The LLM client against a scripted OpenAI-compatible server on a real loopback socket."""

import asyncio

import pytest

from morphguard.errors import JudgeCallCapError, LLMError, LLMTimeoutError
from morphguard.llm.client import CallBudget, Endpoint, LLMClient, call_budget, reserve_up_to
from tests.scripted_llm import ScriptedLLM, completion, error

MESSAGES = [{"role": "user", "content": "Say something."}]


def client(server: ScriptedLLM, **kwargs) -> LLMClient:
    options = {"timeout_s": 5.0, "max_attempts": 3} | kwargs
    return LLMClient(default_model="openai/scripted", api_base=server.base_url, api_key="sk-test", **options)


def run(coro):
    return asyncio.run(coro)


@pytest.mark.parametrize("status", [429, 500, 503])
def test_transient_failures_are_retried_until_success(status):
    outcomes = iter([error(status), error(status), "fine"])
    with ScriptedLLM(lambda body: next(outcomes)) as server:
        reply = run(client(server).complete(MESSAGES))
    assert reply.text == "fine"
    assert len(server.requests) == 3


def test_retries_stop_after_max_attempts_with_a_clear_error():
    with ScriptedLLM(lambda body: error(500)) as server:
        with pytest.raises(LLMError, match="after 3 attempts"):
            run(client(server).complete(MESSAGES))
    assert len(server.requests) == 3


def test_client_errors_are_not_retried():
    with ScriptedLLM(lambda body: error(400, "bad request")) as server:
        with pytest.raises(LLMError) as err:
            run(client(server).complete(MESSAGES))
    assert len(server.requests) == 1
    assert "sk-test" not in str(err.value)


def test_a_call_that_outlives_its_timeout_is_retried_then_reported(caplog):
    with ScriptedLLM(lambda body: "late", delay_s=2.0) as server:
        with pytest.raises(LLMTimeoutError, match="timed out after 2 attempts"):
            run(client(server, timeout_s=0.5, max_attempts=2).complete(MESSAGES))
    # each attempt timed out (on a busy machine the last may give up before the server has read it)
    failures = [r.getMessage() for r in caplog.records if "transient LLM failure" in r.getMessage()]
    assert failures == ["transient LLM failure from openai/scripted: TimeoutError"] * 2
    assert 1 <= len(server.requests) <= 2


def test_usage_comes_from_the_provider():
    with ScriptedLLM(lambda body: completion("hi", prompt_tokens=123, completion_tokens=4)) as server:
        llm = client(server)
        reply = run(llm.complete(MESSAGES))
    assert (reply.input_tokens, reply.output_tokens) == (123, 4)
    assert (llm.usage.calls, llm.usage.input_tokens, llm.usage.output_tokens) == (1, 123, 4)


def test_usage_is_counted_locally_when_the_provider_omits_it():
    with ScriptedLLM(lambda body: completion("a reply of several words", prompt_tokens=None)) as server:
        reply = run(client(server).complete(MESSAGES))
    assert reply.input_tokens > 0
    assert reply.output_tokens > 0


def test_identical_temperature_zero_calls_are_served_from_the_cache():
    with ScriptedLLM(lambda body: "cached answer") as server:
        llm = client(server, cache_entries=10)
        first = run(llm.complete(MESSAGES))
        second = run(llm.complete(MESSAGES))
        run(llm.complete(MESSAGES, temperature=0.7))
        run(llm.complete(MESSAGES, temperature=0.7))
    assert (first.cached, second.cached) == (False, True)
    assert second.text == "cached answer"
    assert len(server.requests) == 3  # one cached repeat, two uncached non-zero-temperature calls
    assert (llm.usage.calls, llm.usage.cached_calls) == (3, 1)


def test_concurrency_limit_bounds_calls_in_flight():
    with ScriptedLLM(lambda body: "ok", delay_s=0.2) as server:
        llm = client(server, concurrency=2)

        async def burst():
            await asyncio.gather(*(llm.complete([{"role": "user", "content": str(i)}]) for i in range(6)))

        run(burst())
    assert len(server.requests) == 6
    assert server.max_in_flight == 2


def test_json_schema_and_logprobs_are_requested_openai_style():
    schema = {"type": "object", "properties": {"verdict": {"type": "string"}}, "required": ["verdict"]}
    logprobs = [{"token": "YES", "logprob": -0.2, "bytes": None,
                 "top_logprobs": [{"token": "YES", "logprob": -0.2, "bytes": None},
                                  {"token": "NO", "logprob": -1.8, "bytes": None}]}]
    with ScriptedLLM(lambda body: completion("YES", logprobs=logprobs)) as server:
        reply = run(client(server).complete(MESSAGES, json_schema=schema, top_logprobs=2))
    sent = server.requests[0]
    assert sent["response_format"]["type"] == "json_schema"
    # in the strict subset OpenAI compiles: the object closed, every property required
    assert sent["response_format"]["json_schema"]["schema"] == {**schema, "additionalProperties": False}
    assert sent["response_format"]["json_schema"]["strict"] is True
    assert sent["logprobs"] is True and sent["top_logprobs"] == 2
    assert reply.logprobs is not None
    assert reply.logprobs[0].token == "YES"
    assert dict(reply.logprobs[0].alternatives)["NO"] == pytest.approx(-1.8)


def test_the_embedded_judge_gets_the_request_as_the_checks_write_it():
    """llama.cpp compiles a whole JSON schema into its grammar, bounds included, and returns log-probabilities:
    nothing is dropped or rewritten for it, so the embedded judge's figures stand."""
    schema = {"type": "object", "required": ["verdicts"], "properties": {
        "verdicts": {"type": "array", "minItems": 2, "maxItems": 2, "items": {"type": "string"}},
        "reason": {"type": "string", "maxLength": 200}}}
    with ScriptedLLM(lambda body: completion('{"verdicts": ["YES", "NO"]}')) as server:
        local = Endpoint("openai/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", server.base_url, "no-key",
                         provider="llama.cpp", strict_schemas=False)
        judge = LLMClient(default_model="local", routes={"local": local}, timeout_s=5.0, max_attempts=1)
        run(judge.complete(MESSAGES, json_schema=schema, top_logprobs=5, max_tokens=16))
    sent = server.requests[0]
    assert sent["response_format"]["json_schema"]["schema"] == schema
    assert sent["temperature"] == 0.0 and sent["max_tokens"] == 16
    assert sent["logprobs"] is True and sent["top_logprobs"] == 5



def test_a_check_sends_no_judge_call_past_its_budget_in_any_of_its_tasks():
    with ScriptedLLM(lambda body: "ok") as server:
        llm = client(server)

        async def check():
            with call_budget(3):
                await llm.complete(MESSAGES)
                asked = await asyncio.gather(*(llm.complete([{"role": "user", "content": str(i)}]) for i in range(3)),
                                             return_exceptions=True)
            return asked

        asked = run(check())
        assert sum(isinstance(a, JudgeCallCapError) for a in asked) == 1
        assert len(server.requests) == 3
        run(llm.complete([{"role": "user", "content": "outside any check"}]))  # no budget open: no cap
    assert len(server.requests) == 4


def test_calls_reserved_at_once_are_taken_as_far_as_the_budget_goes():
    with ScriptedLLM(lambda body: "ok") as server:
        llm = client(server)

        async def check():
            with call_budget(4) as budget:
                assert reserve_up_to(2) == 2
                await llm.complete([{"role": "user", "content": "a"}])
                await llm.complete([{"role": "user", "content": "b"}])  # both reserved: the budget has two left
                assert reserve_up_to(5) == 2 and budget is not None and budget.used == 4
                await llm.complete([{"role": "user", "content": "c"}])
                assert reserve_up_to(1) == 0  # all taken: none left to reserve
                await llm.complete([{"role": "user", "content": "d"}])  # the last one reserved
                with pytest.raises(JudgeCallCapError):
                    await llm.complete([{"role": "user", "content": "e"}])

        run(check())
    assert [r["messages"][0]["content"] for r in server.requests] == ["a", "b", "c", "d"]


def test_checks_sharing_a_budget_draw_on_it_together():
    """The checks of one stream: each opens the stream's budget, so the cap bounds them all, not each."""
    shared = CallBudget(3)
    for _ in range(2):
        with call_budget(100, shared) as budget:
            assert budget is shared
            taken = reserve_up_to(2)
    assert taken == 1 and shared.used == 3
