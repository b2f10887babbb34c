"""The proxy end to end: the official `openai` client → morphguard under uvicorn → a scripted provider."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest

from tests.scripted_llm import sentences_score

PASSAGE = "Ibuprofen is contraindicated in the third trimester of pregnancy."
QUESTION = "Can pregnant women take ibuprofen for back pain?"


@pytest.fixture(scope="module")
def annotate_proxy(proxy_factory) -> str:
    return proxy_factory()


@pytest.fixture(scope="module")
def block_proxy(proxy_factory) -> str:
    return proxy_factory(policy={"profiles": {"general": {"action": "block", "topics": {}}}}, stream_mode="buffer",
                         upstream={"api_key": "sk-upstream-secret"}, keys=["mg-key-1", "mg-key-2"])


@pytest.fixture(scope="module")
def async_proxy(proxy_factory) -> str:
    return proxy_factory(mode="async", stream_mode="async")


def client(base: str, key: str = "sk-client", timeout: float = 30) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=timeout)


def ask(model: str, **extra):
    return dict(model=model, messages=[{"role": "user", "content": QUESTION}], **extra)


def verdict_of(completion) -> dict:
    return completion.model_extra["morphguard"]


def upstream_requests(provider: str) -> list[dict]:
    return httpx.get(provider.removesuffix("/v1") + "/_requests").json()


def test_explicit_context_is_checked_and_stripped_before_forwarding(annotate_proxy, provider):
    completion = client(annotate_proxy).chat.completions.create(
        **ask("faithful"), extra_body={"morphguard": {"context": [PASSAGE], "topic": "pregnancy"}})
    verdict = verdict_of(completion)
    assert verdict["checked"] and verdict["context_source"] == "explicit"
    assert verdict["score"] == round(sentences_score(whole=False, sentence=False), 4)  # the judge passes it all
    assert not verdict["flagged"] and verdict["action"] == "pass"
    assert (verdict["profile"], verdict["topic"], verdict["threshold"]) == ("general", "pregnancy", 0.175)
    assert completion.choices[0].message.content == PASSAGE
    assert completion.system_fingerprint == "fp_fake_unknown_field_kept"  # unknown fields survive
    rag_calls = [r for r in upstream_requests(provider) if r["body"]["model"] == "faithful"]
    assert "morphguard" not in rag_calls[-1]["body"]
    assert rag_calls[-1]["authorization"] == "Bearer sk-client"  # the client's key goes through


def test_tool_messages_are_context_and_a_hallucination_is_flagged(annotate_proxy):
    raw = client(annotate_proxy).chat.completions.with_raw_response.create(
        model="hallucinated",
        messages=[{"role": "user", "content": QUESTION},
                  {"role": "assistant", "content": None,
                   "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{}"}}]},
                  {"role": "tool", "tool_call_id": "c1", "content": PASSAGE}])
    verdict = verdict_of(raw.parse())
    assert verdict["context_source"] == "tool"
    assert verdict["flagged"] and verdict["score"] == round(sentences_score(whole=True, sentence=True), 4)
    assert verdict["detector"] == "sentences"  # `auto` with an API judge
    assert [f["text"] for f in verdict["factoids"]] == ["safe throughout"]  # the phrase the judge names
    assert raw.headers["x-morphguard-flagged"] == "true"
    assert raw.headers["x-morphguard-action"] == "annotate"
    assert float(raw.headers["x-morphguard-score"]) == round(sentences_score(whole=True, sentence=True), 4)


def test_tagged_context_blocks_are_found(annotate_proxy):
    completion = client(annotate_proxy).chat.completions.create(
        model="hallucinated",
        messages=[{"role": "system", "content": f"Answer from the documents.\n<documents>{PASSAGE}</documents>"},
                  {"role": "user", "content": QUESTION}])
    verdict = verdict_of(completion)
    assert verdict["context_source"] == "tags" and verdict["flagged"]


def test_without_context_the_answer_is_passed_and_says_so(annotate_proxy):
    completion = client(annotate_proxy).chat.completions.create(**ask("hallucinated"))
    verdict = verdict_of(completion)
    assert (verdict["checked"], verdict["reason"], verdict["action"]) == (False, "no_context", "pass")


def test_async_client_works_through_the_proxy(annotate_proxy):
    async def call():
        async with openai.AsyncOpenAI(base_url=annotate_proxy + "/v1", api_key="k", max_retries=0) as c:
            return await c.chat.completions.create(**ask("hallucinated"),
                                                   extra_body={"morphguard": {"context": PASSAGE}})

    assert verdict_of(asyncio.run(call()))["flagged"]


def test_passthrough_stream_ends_with_the_verdict_chunk(annotate_proxy):
    stream = client(annotate_proxy).chat.completions.create(
        **ask("hallucinated", stream=True), extra_body={"morphguard": {"context": PASSAGE}})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Ibuprofen is safe throughout pregnancy."
    last = chunks[-1]
    assert last.choices == []
    assert last.model_extra["morphguard"]["flagged"] is True
    assert last.model_extra["morphguard"]["action"] == "annotate"  # passthrough cannot block


def test_models_and_embeddings_pass_through(annotate_proxy):
    c = client(annotate_proxy)
    assert [m.id for m in c.models.list()] == ["faithful", "hallucinated"]
    embedding = c.embeddings.create(model="embed", input=["abc", "de"])
    assert [e.embedding for e in embedding.data] == [[0.1, 0.2, 3.0], [0.1, 0.2, 2.0]]


@pytest.mark.parametrize(("body", "status", "param"), [
    (b"{not json", 400, None),
    (b'{"model": "faithful"}', 400, "messages"),
    (b'{"model": "faithful", "messages": "hello"}', 400, "messages"),
    (b'{"model": "faithful", "messages": [{"content": "no role"}]}', 400, "messages[0]"),
    (b'{"model": "faithful", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}', 400, "stream"),
    (b'{"model": "faithful", "messages": [{"role": "user", "content": "x"}], "morphguard": {"context": 3}}', 400,
     "morphguard.context"),
    (b'{"model": "faithful", "messages": [{"role": "user", "content": "' + b"x" * 4_100_000 + b'"}]}', 413, None),
])
def test_bad_requests_get_openai_shaped_errors(annotate_proxy, body, status, param):
    response = httpx.post(annotate_proxy + "/v1/chat/completions", content=body, timeout=30,
                          headers={"content-type": "application/json", "authorization": "Bearer k"})
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param
    assert "Traceback" not in response.text


def test_upstream_client_errors_pass_through_unchanged(annotate_proxy):
    with pytest.raises(openai.BadRequestError) as err:
        client(annotate_proxy).chat.completions.create(**ask("fail-400"))
    assert err.value.status_code == 400
    assert err.value.code == "model_not_found"


def test_upstream_server_errors_are_reported_as_502_and_not_resent(annotate_proxy, provider):
    before = sum(r["body"]["model"] == "fail-500" for r in upstream_requests(provider))
    with pytest.raises(openai.APIStatusError) as err:
        client(annotate_proxy).chat.completions.create(**ask("fail-500"))
    assert err.value.status_code == 502
    assert err.value.body["type"] == "upstream_error"
    # a 500 may come after the provider did the (billed) work: never sent twice
    assert sum(r["body"]["model"] == "fail-500" for r in upstream_requests(provider)) - before == 1


def test_transient_upstream_failures_are_retried_to_success(annotate_proxy):
    completion = client(annotate_proxy).chat.completions.create(**ask("flaky"))
    assert completion.choices[0].message.content == PASSAGE


def test_an_upstream_that_does_not_answer_in_time_gives_504(annotate_proxy):
    with pytest.raises(openai.APIStatusError) as err:
        client(annotate_proxy).chat.completions.create(**ask("slow"))
    assert err.value.status_code == 504


def test_health_and_readiness(annotate_proxy):
    assert httpx.get(annotate_proxy + "/healthz").json() == {"status": "ok"}
    ready = httpx.get(annotate_proxy + "/readyz")
    assert ready.status_code == 200 and ready.json()["checks"] == {"upstream": True, "queue": True, "store": True}


def test_block_config_replaces_a_hallucinated_answer(block_proxy):
    completion = client(block_proxy, key="mg-key-2").chat.completions.create(
        **ask("hallucinated"), extra_body={"morphguard": {"context": PASSAGE}})
    assert completion.choices[0].finish_reason == "stop"
    assert "reliable answer" in completion.choices[0].message.content
    assert completion.choices[0].message.refusal == completion.choices[0].message.content
    assert verdict_of(completion)["action"] == "block"


def test_block_config_lets_a_faithful_answer_through(block_proxy):
    completion = client(block_proxy, key="mg-key-1").chat.completions.create(
        **ask("faithful"), extra_body={"morphguard": {"context": PASSAGE}})
    assert completion.choices[0].finish_reason == "stop"
    assert completion.choices[0].message.content == PASSAGE


def test_buffered_stream_can_block(block_proxy):
    stream = client(block_proxy, key="mg-key-1").chat.completions.create(
        **ask("hallucinated", stream=True), extra_body={"morphguard": {"context": PASSAGE}})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "reliable answer" in text and "safe throughout" not in text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert "reliable answer" in "".join(c.choices[0].delta.refusal or "" for c in chunks if c.choices)
    assert chunks[-1].model_extra["morphguard"]["action"] == "block"


def test_injected_upstream_key_requires_a_proxy_key(block_proxy, provider):
    with pytest.raises(openai.AuthenticationError) as err:
        client(block_proxy, key="wrong").chat.completions.create(**ask("faithful"))
    assert err.value.status_code == 401
    client(block_proxy, key="mg-key-1").chat.completions.create(**ask("faithful"))
    last = upstream_requests(provider)[-1]
    assert last["authorization"] == "Bearer sk-upstream-secret"


def judge_calls(provider: str) -> int:
    """The `sentences` check's calls the provider has had (one per batch of sentences)."""
    return sum("sentences are numbered" in json.dumps(r["body"]["messages"][:1]) for r in upstream_requests(provider))


def test_async_mode_answers_at_once_and_checks_in_the_background(async_proxy, provider):
    c = client(async_proxy)
    before = judge_calls(provider)
    completion = c.chat.completions.create(**ask("hallucinated"), extra_body={"morphguard": {"context": PASSAGE}})
    verdict = verdict_of(completion)
    assert (verdict["checked"], verdict["reason"], verdict["action"]) == (False, "queued", "pass")
    assert completion.choices[0].message.content == "Ibuprofen is safe throughout pregnancy."
    # another passage, so the judge's response cache cannot answer the second check from the first
    stream = c.chat.completions.create(**ask("hallucinated", stream=True),
                                       extra_body={"morphguard": {"context": PASSAGE + " Ask a doctor."}})
    assert list(stream)[-1].model_extra["morphguard"]["reason"] == "queued"
    deadline = time.monotonic() + 120  # a bounded wait for the background checks, not a timing claim
    while judge_calls(provider) < before + 2 and time.monotonic() < deadline:  # 2 checks of one sentence each
        time.sleep(0.2)
    assert judge_calls(provider) >= before + 2


@pytest.fixture(scope="module")
def litellm_proxy(proxy_factory, provider) -> str:
    # "openai/" stands in for a non-OpenAI prefix (anthropic/, gemini/, ...): the same litellm path,
    # pointed at the scripted provider instead of a paid API.
    return proxy_factory(litellm_routes=[{"prefix": "openai/", "api_base": provider, "api_key": "sk-via-litellm"}])


def test_models_matching_a_litellm_route_go_through_litellm_and_are_checked(litellm_proxy, provider):
    c = client(litellm_proxy)
    completion = c.chat.completions.create(**ask("openai/hallucinated"),
                                           extra_body={"morphguard": {"context": PASSAGE}})
    assert completion.choices[0].message.content == "Ibuprofen is safe throughout pregnancy."
    assert verdict_of(completion)["flagged"]
    sent = [r for r in upstream_requests(provider) if r["body"]["model"] == "hallucinated"][-1]
    assert sent["authorization"] == "Bearer sk-via-litellm" and "morphguard" not in sent["body"]

    stream = c.chat.completions.create(**ask("openai/hallucinated", stream=True),
                                       extra_body={"morphguard": {"context": PASSAGE}})
    chunks = list(stream)
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == \
        "Ibuprofen is safe throughout pregnancy."
    assert chunks[-1].model_extra["morphguard"]["flagged"] is True


def test_a_request_can_choose_its_detector_only_where_policy_allows_it(annotate_proxy, proxy_factory):
    with pytest.raises(openai.BadRequestError) as err:
        client(annotate_proxy).chat.completions.create(
            **ask("hallucinated"), extra_body={"morphguard": {"context": PASSAGE, "detector": "length"}})
    assert err.value.body["param"] == "morphguard.detector" and "request_override" in err.value.body["message"]
    open_proxy = proxy_factory(policy={"request_override": True})
    completion = client(open_proxy).chat.completions.create(
        **ask("hallucinated"), extra_body={"morphguard": {"context": PASSAGE, "detector": "length"}})
    verdict = verdict_of(completion)
    assert verdict["detector"] == "length" and verdict["checked"]
    with pytest.raises(openai.BadRequestError) as err:
        client(open_proxy).chat.completions.create(
            **ask("hallucinated"), extra_body={"morphguard": {"context": PASSAGE, "detector": "oracle"}})
    assert err.value.body["param"] == "morphguard.detector" and "claims" in err.value.body["message"]
