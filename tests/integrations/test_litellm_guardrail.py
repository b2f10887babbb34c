"""morphguard as a guardrail of the real LiteLLM proxy (the version the benchmarks pin), run as its own process.

LiteLLM loads `morphguard.integrations.litellm.MorphguardGuardrail` from its `guardrails:` config; its models are
the scripted provider, which is the judge too (exact, known verdicts). The client is the official `openai` SDK.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from tests.e2e.conftest import start
from tests.integrations.conftest import FAITHFUL, HALLUCINATED, PASSAGE, QUESTION, SAFE, rows
from tests.scripted_llm import sentences_score
from tests.servers import free_port, stop

MASTER = "sk-litellm-master-0123"


def start_litellm(provider: str, folder: Path, mode: list[str], judge: str = "openai/judge", **proxy: object):
    """The LiteLLM proxy with morphguard as a guardrail in `mode` (and morphguard's `proxy` settings); its base URL and
    process."""
    # here, not at import: only the worker that runs these tests pays for importing LiteLLM's proxy
    pytest.importorskip("litellm.proxy.proxy_server", reason="needs litellm[proxy] (the bench extra)")
    morphguard = {
        "proxy": proxy,
        "judge": {"model": judge, "api_base": provider, "api_key": "sk-judge", "max_attempts": 1},
        "detector": {"name": "auto"},
        "policy": {
            "profiles": {"general": {"threshold": 0.5, "action": "annotate", "topics": {}},
                         "strict": {"threshold": 0.5, "action": "block", "topics": {}, "safe_message": SAFE},
                         "closed": {"threshold": 0.5, "action": "block", "topics": {}, "safe_message": SAFE,
                                    "on_error": "fail_closed", "latency_budget_s": 1},
                         "lenient": {"threshold": 0.5, "action": "block", "topics": {}, "safe_message": SAFE,
                                     "on_error": "fail_open"},
                         "marked": {"threshold": 0.5, "action": "highlight", "topics": {}}},
            "routes": [{"profile": "strict", "headers": {"x-tenant": "clinic"}},
                       {"profile": "closed", "headers": {"x-tenant": "closed"}},
                       {"profile": "lenient", "headers": {"x-tenant": "lenient"}},
                       {"profile": "marked", "headers": {"x-tenant": "marked"}}],
            "highlight": {"open": "[!", "close": "!]"},
            "audit": {"path": str(folder / "audit.db"), "store_text": "full"},
        },
    }
    (folder / "morphguard.yaml").write_text(yaml.safe_dump(morphguard))
    models = [{"model_name": name, "litellm_params": {"model": f"openai/{name}", "api_base": provider,
                                                      "api_key": "sk-upstream"}}
              for name in ("faithful", "hallucinated", "fail-400", "two-choices")]
    config = {
        "model_list": models,
        "guardrails": [{"guardrail_name": "morphguard", "litellm_params": {
            "guardrail": "morphguard.integrations.litellm.MorphguardGuardrail",
            "mode": mode, "default_on": True,
            "morphguard_config": str(folder / "morphguard.yaml")}}],
        "general_settings": {"master_key": MASTER},
    }
    (folder / "litellm.yaml").write_text(yaml.safe_dump(config))
    port = free_port()
    litellm_cli = shutil.which("litellm", path=str(Path(sys.executable).parent))
    assert litellm_cli, "the litellm command comes with litellm[proxy]"
    process = start([litellm_cli, "--config", str(folder / "litellm.yaml"), "--host", "127.0.0.1", "--port",
                     str(port)], f"http://127.0.0.1:{port}/health/liveliness", folder / "litellm.log", timeout=180,
                    env={"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"})
    return f"http://127.0.0.1:{port}", process


@pytest.fixture(scope="module")
def gateway(provider, tmp_path_factory):
    folder = tmp_path_factory.mktemp("litellm")
    base, process = start_litellm(provider, folder, ["pre_call", "post_call"])
    yield base, folder
    stop(process)


@pytest.fixture(scope="module")
def late_gateway(provider, tmp_path_factory):
    """Reading the request while the provider answers (during_call), checking after (post_call)."""
    folder = tmp_path_factory.mktemp("litellm-late")
    base, process = start_litellm(provider, folder, ["during_call", "post_call"])
    yield base, folder
    stop(process)


@pytest.fixture(scope="module")
def post_gateway(provider, tmp_path_factory):
    """The guardrail in `post_call` mode alone (it reads each request when the answer is there), checking at most one
    choice of an answer."""
    folder = tmp_path_factory.mktemp("litellm-post")
    base, process = start_litellm(provider, folder, ["post_call"], max_choices=1)
    yield base, folder
    stop(process)


@pytest.fixture(scope="module")
def slow_gateway(provider, tmp_path_factory):
    """A judge that takes 3 s a call: no check ends within the `closed` profile's 1 s budget. The guardrail in
    `post_call` mode alone: it reads each request when the answer is there."""
    folder = tmp_path_factory.mktemp("litellm-slow")
    base, process = start_litellm(provider, folder, ["post_call"], judge="openai/slow-judge")
    yield base, folder
    stop(process)


def client(base: str, **headers: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key=MASTER, max_retries=0, timeout=60,
                         default_headers=headers or None)


def ask(c: openai.OpenAI, model: str, **kwargs):
    return c.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": QUESTION}],
        extra_body={"morphguard": {"context": [PASSAGE]}}, **kwargs)


def test_a_grounded_answer_passes_with_its_verdict(gateway, provider):
    base, folder = gateway
    raw = ask(client(base), "faithful")
    completion = raw.parse()
    assert completion.choices[0].message.content == FAITHFUL
    verdict = completion.model_extra["morphguard"]
    assert verdict["checked"] is True and verdict["flagged"] is False and verdict["action"] == "pass"
    assert raw.headers["x-morphguard-action"] == "pass" and raw.headers["x-morphguard-checked"] == "true"
    row = rows(folder)[verdict["request_id"]]
    assert row["checked"] == 1 and row["answer"] == FAITHFUL and row["context"] == PASSAGE
    assert row["question"] == QUESTION and row["context_source"] == "explicit"
    # the provider got the chat without morphguard's field or its state
    sent = [r["body"] for r in httpx.get(f"{provider.removesuffix('/v1')}/_requests").json()
            if r["body"].get("model") == "faithful"][-1]
    assert "morphguard" not in json.dumps(sent)


def test_a_hallucinated_answer_is_annotated_under_the_default_profile(gateway):
    base, folder = gateway
    completion = ask(client(base), "hallucinated").parse()
    assert completion.choices[0].message.content == HALLUCINATED
    verdict = completion.model_extra["morphguard"]
    assert verdict["flagged"] is True and verdict["action"] == "annotate"
    assert verdict["score"] == round(sentences_score(whole=True, sentence=True), 4)
    assert rows(folder)[verdict["request_id"]]["flagged"] == 1


def test_a_hallucinated_answer_under_a_block_profile_is_rejected(gateway):
    base, folder = gateway
    before = set(rows(folder))
    with pytest.raises(openai.BadRequestError) as raised:
        ask(client(base, **{"x-tenant": "clinic"}), "hallucinated")
    assert raised.value.status_code == 400
    assert SAFE in str(raised.value) and HALLUCINATED not in str(raised.value)
    [new] = [r for key, r in rows(folder).items() if key not in before]
    assert (new["profile"], new["action"], new["flagged"], new["answer"]) == ("strict", "block", 1, HALLUCINATED)
    # the same tenant with a grounded answer passes
    assert ask(client(base, **{"x-tenant": "clinic"}), "faithful").parse().choices[0].message.content == FAITHFUL


def test_a_stream_is_checked_whole_and_carries_its_verdict(gateway):
    base, folder = gateway
    stream = client(base).chat.completions.create(
        model="hallucinated", messages=[{"role": "user", "content": QUESTION}], stream=True,
        extra_body={"morphguard": {"context": [PASSAGE]}})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == HALLUCINATED
    verdicts = [c.model_extra["morphguard"] for c in chunks if (c.model_extra or {}).get("morphguard")]
    assert len(verdicts) == 1 and verdicts[0]["flagged"] is True and verdicts[0]["action"] == "annotate"
    assert rows(folder)[verdicts[0]["request_id"]]["answer"] == HALLUCINATED


def test_a_blocked_stream_is_rejected_before_any_text(gateway):
    base, folder = gateway
    before = set(rows(folder))
    with pytest.raises(openai.APIError) as raised:
        stream = client(base, **{"x-tenant": "clinic"}).chat.completions.create(
            model="hallucinated", messages=[{"role": "user", "content": QUESTION}], stream=True,
            extra_body={"morphguard": {"context": [PASSAGE]}})
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert HALLUCINATED not in text
    assert HALLUCINATED not in str(raised.value)
    [new] = [r for key, r in rows(folder).items() if key not in before]
    assert new["action"] == "block"


def test_a_request_without_context_passes_unchecked_and_audited(gateway):
    base, folder = gateway
    completion = client(base).chat.completions.create(
        model="faithful", messages=[{"role": "user", "content": QUESTION}])
    verdict = completion.model_extra["morphguard"]
    assert verdict["checked"] is False and verdict["reason"] == "no_context"
    assert rows(folder)[verdict["request_id"]]["reason"] == "no_context"


def test_a_malformed_morphguard_field_is_a_400(gateway):
    base, folder = gateway
    before = len(rows(folder))
    with pytest.raises(openai.BadRequestError) as raised:
        client(base).chat.completions.create(model="faithful", messages=[{"role": "user", "content": QUESTION}],
                                             extra_body={"morphguard": {"context": [1, 2]}})
    assert "morphguard.context" in str(raised.value)
    assert len(rows(folder)) == before


def test_a_failed_provider_call_is_audited(gateway):
    base, folder = gateway
    before = set(rows(folder))
    with pytest.raises(openai.APIError):
        ask(client(base), "fail-400")
    [new] = [r for key, r in rows(folder).items() if key not in before]
    assert new["checked"] == 0 and new["reason"] == "upstream_error"


@pytest.mark.slow  # a LiteLLM host of its own (the guardrail in another mode)
def test_during_call_mode_reads_tagged_context_and_checks_after(late_gateway):
    base, folder = late_gateway
    tagged = [{"role": "system", "content": f"Answer from the context.\n<context>{PASSAGE}</context>"},
              {"role": "user", "content": QUESTION}]
    for model, flagged in (("faithful", False), ("hallucinated", True)):
        completion = client(base).chat.completions.create(model=model, messages=tagged)
        verdict = completion.model_extra["morphguard"]
        assert verdict["checked"] is True and verdict["flagged"] is flagged
        row = rows(folder)[verdict["request_id"]]
        assert row["context_source"] == "tags" and row["question"] == QUESTION
    with pytest.raises(openai.BadRequestError):  # a malformed field is refused in this mode too
        client(base).chat.completions.create(model="faithful", messages=tagged,
                                             extra_body={"morphguard": {"topic": 5}})


# --- every API LiteLLM's proxy serves an answer by, and every choice -------------------------------------------------


def native(provider: str, path: str) -> list[dict]:
    return [r["body"] for r in httpx.get(f"{provider.removesuffix('/v1')}/_native").json() if r["path"] == path]


def new_rows(folder: Path, before: set[str]) -> list[dict]:
    return [r for key, r in rows(folder).items() if key not in before]


def test_a_responses_call_is_checked_and_the_field_never_forwarded(gateway, provider):
    base, folder = gateway
    response = client(base).responses.create(model="faithful", input=QUESTION,
                                             extra_body={"morphguard": {"context": [PASSAGE]}})
    assert response.output_text == FAITHFUL
    verdict = response.model_extra["morphguard"]
    assert verdict["checked"] is True and verdict["action"] == "pass"
    assert rows(folder)[verdict["request_id"]]["context"] == PASSAGE
    assert "morphguard" not in json.dumps(native(provider, "responses")[-1])
    before = set(rows(folder))
    with pytest.raises(openai.BadRequestError) as raised:
        client(base, **{"x-tenant": "clinic"}).responses.create(
            model="hallucinated", input=QUESTION, extra_body={"morphguard": {"context": [PASSAGE]}})
    assert SAFE in str(raised.value) and HALLUCINATED not in str(raised.value)
    [row] = new_rows(folder, before)
    assert (row["action"], row["answer"]) == ("block", HALLUCINATED)


def test_a_messages_call_is_checked_and_the_field_never_forwarded(gateway, provider):
    base, folder = gateway
    before = set(rows(folder))
    body = {"model": "hallucinated", "max_tokens": 100, "messages": [{"role": "user", "content": QUESTION}],
            "morphguard": {"context": [PASSAGE]}}
    headers = {"authorization": f"Bearer {MASTER}"}
    response = httpx.post(f"{base}/v1/messages", json=body, headers={**headers, "x-tenant": "clinic"}, timeout=60)
    assert response.status_code == 400 and SAFE in response.text and HALLUCINATED not in response.text
    [row] = new_rows(folder, before)
    assert (row["action"], row["answer"], row["context"]) == ("block", HALLUCINATED, PASSAGE)
    answer = httpx.post(f"{base}/v1/messages", json={**body, "model": "faithful"}, headers=headers, timeout=60)
    assert answer.status_code == 200 and answer.json()["content"][0]["text"] == FAITHFUL
    assert answer.json()["morphguard"]["action"] == "pass"
    # LiteLLM sends a Messages call for an OpenAI model to the provider's Responses API
    sent = native(provider, "responses")[-1]
    assert sent["model"] == "faithful" and "morphguard" not in json.dumps(sent)


def test_a_text_completion_is_checked(gateway, provider):
    base, folder = gateway
    before = set(rows(folder))
    with pytest.raises(openai.BadRequestError):
        client(base, **{"x-tenant": "clinic"}).completions.create(
            model="hallucinated", prompt=QUESTION, extra_body={"morphguard": {"context": [PASSAGE]}})
    [row] = new_rows(folder, before)
    assert (row["action"], row["answer"]) == ("block", HALLUCINATED)
    completion = client(base).completions.create(model="faithful", prompt=QUESTION,
                                                  extra_body={"morphguard": {"context": [PASSAGE]}})
    assert completion.choices[0].text == FAITHFUL and completion.model_extra["morphguard"]["checked"] is True
    assert "morphguard" not in json.dumps(native(provider, "completions")[-1])


def test_every_choice_of_an_answer_is_checked(gateway):
    base, folder = gateway
    before = set(rows(folder))
    with pytest.raises(openai.BadRequestError) as raised:
        ask(client(base, **{"x-tenant": "clinic"}), "two-choices", n=2)
    assert HALLUCINATED not in str(raised.value)
    assert sorted((r["answer"], r["action"]) for r in new_rows(folder, before)) == [
        (FAITHFUL, "pass"), (HALLUCINATED, "block")]
    completion = ask(client(base), "two-choices", n=2).parse()
    verdict = completion.model_extra["morphguard"]
    assert len(completion.choices) == 2 and verdict["flagged"] is True
    assert [c["flagged"] for c in verdict["choices"]] == [False, True]


def test_a_responses_stream_is_decided_by_on_error_and_audited(gateway):
    base, folder = gateway
    before = set(rows(folder))
    events = list(client(base).responses.create(model="hallucinated", input=QUESTION, stream=True,
                                                extra_body={"morphguard": {"context": [PASSAGE]}}))
    assert events
    [row] = new_rows(folder, before)
    assert (row["checked"], row["action"], row["reason"], row["unchecked"]) == (0, "pass", "fail_open: stream", 1)
    for tenant in ("closed", "clinic"):  # `clinic` blocks and says nothing of on_error: it fails closed
        before = set(rows(folder))
        with pytest.raises(openai.APIError):
            list(client(base, **{"x-tenant": tenant}).responses.create(
                model="hallucinated", input=QUESTION, stream=True, extra_body={"morphguard": {"context": [PASSAGE]}}))
        [row] = new_rows(folder, before)
        assert (row["action"], row["reason"], row["unchecked"]) == ("block", "fail_closed: stream", 0)


@pytest.mark.slow  # a LiteLLM of its own, and a judge slower than its timeout
def test_a_slow_judge_is_decided_by_on_error(slow_gateway):
    base, folder = slow_gateway
    with pytest.raises(openai.BadRequestError) as raised:
        ask(client(base, **{"x-tenant": "closed"}), "hallucinated")
    assert SAFE in str(raised.value) and HALLUCINATED not in str(raised.value)
    [row] = rows(folder).values()
    assert (row["checked"], row["action"], row["reason"]) == (0, "block", "fail_closed: latency_budget_exceeded")
    body = {"model": "hallucinated", "max_tokens": 100, "messages": [{"role": "user", "content": QUESTION}],
            "morphguard": {"context": [PASSAGE]}}
    response = httpx.post(f"{base}/v1/messages", json=body, timeout=60,
                          headers={"authorization": f"Bearer {MASTER}", "x-tenant": "closed"})
    assert response.status_code == 400 and SAFE in response.text and HALLUCINATED not in response.text
    assert sorted(r["reason"] for r in rows(folder).values()) == ["fail_closed: latency_budget_exceeded"] * 2


# --- what the client cannot steer, what every stream leaves, what each row says the gateway was told ------------------


@pytest.mark.slow  # a LiteLLM host of its own (the guardrail in another mode)
@pytest.mark.parametrize("named", ["aresponses", "anthropic_messages", "aembedding", "atext_completion"])
def test_the_call_type_is_litellms_never_the_clients_metadata(post_gateway, named):
    base, folder = post_gateway
    before = set(rows(folder))
    completion = client(base).chat.completions.create(
        model="hallucinated", messages=[{"role": "user", "content": QUESTION}],
        metadata={"morphguard_call_type": named, "morphguard_request": "not-a-token"},
        extra_body={"morphguard": {"context": [PASSAGE]}})
    verdict = completion.model_extra["morphguard"]
    assert verdict["checked"] is True and verdict["flagged"] is True and verdict["action"] == "annotate"
    [row] = new_rows(folder, before)
    assert (row["answer"], row["context"], row["gateway"]) == (HALLUCINATED, PASSAGE, "litellm:pass")


def test_a_stream_of_several_choices_carries_each_choices_action(gateway):
    base, folder = gateway
    before = set(rows(folder))
    stream = client(base, **{"x-tenant": "marked"}).chat.completions.create(
        model="two-choices", n=2, messages=[{"role": "user", "content": QUESTION}], stream=True,
        extra_body={"morphguard": {"context": [PASSAGE]}})
    chunks = list(stream)
    texts = {i: "".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == i)
             for i in (0, 1)}
    assert texts[0] == FAITHFUL and texts[1] == "Ibuprofen is [!safe throughout!] pregnancy."  # the judge's phrase
    [verdict] = [c.model_extra["morphguard"] for c in chunks if (c.model_extra or {}).get("morphguard")]
    assert [c["action"] for c in verdict["choices"]] == ["pass", "highlight"]
    assert sorted((r["answer"], r["action"]) for r in new_rows(folder, before)) == [
        (FAITHFUL, "pass"), (HALLUCINATED, "highlight")]


@pytest.mark.slow  # a LiteLLM host of its own (the guardrail in another mode)
@pytest.mark.parametrize("api", ["responses", "messages"])
def test_a_stream_the_guardrail_cannot_read_is_audited_in_post_call_mode_alone(post_gateway, api):
    base, folder = post_gateway

    def stream(tenant: str | None) -> httpx.Response:
        body: dict = {"model": "hallucinated", "stream": True, "morphguard": {"context": [PASSAGE]}}
        if api == "responses":
            body["input"] = QUESTION
        else:
            body.update(max_tokens=100, messages=[{"role": "user", "content": QUESTION}])
        headers = {"authorization": f"Bearer {MASTER}", **({"x-tenant": tenant} if tenant else {})}
        return httpx.post(f"{base}/v1/{api}", json=body, headers=headers, timeout=60)

    before = set(rows(folder))
    sent = stream(None)
    assert sent.status_code == 200 and "throughout" in sent.text
    [row] = new_rows(folder, before)
    assert (row["checked"], row["action"], row["reason"], row["gateway"]) == (
        0, "pass", "fail_open: stream", "litellm:pass")
    assert row["context"] == PASSAGE
    for tenant in ("closed", "clinic"):  # `clinic` blocks and says nothing of on_error: it fails closed
        before = set(rows(folder))
        refused = stream(tenant)
        assert "throughout" not in refused.text and SAFE in refused.text
        [row] = new_rows(folder, before)
        assert (row["action"], row["reason"], row["gateway"]) == ("block", "fail_closed: stream", "litellm:deny")


@pytest.mark.slow  # a LiteLLM host of its own (the guardrail in another mode)
def test_choices_past_the_cap_are_decided_by_on_error_and_audited(post_gateway):
    base, folder = post_gateway
    before = set(rows(folder))
    # `lenient` fails open: the first choice is checked and passes, the second is past the cap of one, and passes
    completion = ask(client(base, **{"x-tenant": "lenient"}), "two-choices", n=2).parse()
    assert [c.message.content for c in completion.choices] == [FAITHFUL, HALLUCINATED]
    verdict = completion.model_extra["morphguard"]
    assert [(c["checked"], c.get("reason")) for c in verdict["choices"]] == [
        (True, None), (False, "fail_open: too_many_choices")]
    assert sorted((r["checked"], r["action"], r["reason"], r["gateway"]) for r in new_rows(folder, before)) == [
        (0, "pass", "fail_open: too_many_choices", "litellm:pass"), (1, "pass", None, "litellm:pass")]
    # `closed` fails closed, and so does `strict`, which blocks and says nothing of on_error: the unchecked choice
    # refuses the whole answer
    for tenant in ("closed", "clinic"):
        before = set(rows(folder))
        with pytest.raises(openai.BadRequestError) as raised:
            ask(client(base, **{"x-tenant": tenant}), "two-choices", n=2)
        assert SAFE in str(raised.value) and HALLUCINATED not in str(raised.value)
        assert sorted((r["action"], r["reason"], r["gateway"]) for r in new_rows(folder, before)) == [
            ("block", "fail_closed: too_many_choices", "litellm:deny"), ("pass", None, "litellm:deny")]


def test_each_row_says_what_the_gateway_was_told(gateway):
    base, folder = gateway
    before = set(rows(folder))
    with pytest.raises(openai.BadRequestError):
        ask(client(base, **{"x-tenant": "clinic"}), "two-choices", n=2)
    # the grounded choice was not withheld for itself, but LiteLLM refused the whole answer: both rows say so
    assert sorted((r["action"], r["gateway"]) for r in new_rows(folder, before)) == [
        ("block", "litellm:deny"), ("pass", "litellm:deny")]
    before = set(rows(folder))
    with pytest.raises(openai.APIError):
        ask(client(base), "fail-400")
    [row] = new_rows(folder, before)
    assert (row["reason"], row["gateway"]) == ("upstream_error", "litellm:failed")
