"""POST /v1/check and the Portkey webhook shape, through `morphguard serve` under uvicorn.

The judge is the scripted provider (exact, known verdicts); the client is httpx. The Portkey request and response
examples in data/portkey_webhook.json are recorded from Portkey's documentation:
https://portkey.ai/docs/product/guardrails/bring-your-own-guardrails
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import serve
from tests.integrations.conftest import (
    CLINIC_KEY,
    FAITHFUL,
    HALLUCINATED,
    KEY,
    PASSAGE,
    QUESTION,
    SAFE,
    gateway_config,
    rows,
)
from tests.scripted_llm import sentences_score
from tests.servers import stop

DATA = Path(__file__).parent / "data"


def post(base: str, path: str, body: Any, key: str | None = KEY, **headers: str) -> httpx.Response:
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{base}{path}", content=content, headers={"content-type": "application/json", **headers},
                      timeout=30)


def check_body(answer: str, **extra: Any) -> dict[str, Any]:
    return {"question": QUESTION, "context": [PASSAGE], "answer": answer, **extra}


def test_a_grounded_answer_passes_with_its_verdict_and_audit_row(checker):
    base, folder = checker
    response = post(base, "/v1/check", check_body(FAITHFUL, model="gpt-4o-mini"))
    assert response.status_code == 200, response.text
    verdict = response.json()
    assert verdict["checked"] is True and verdict["flagged"] is False and verdict["action"] == "pass"
    assert verdict["score"] == round(sentences_score(whole=False, sentence=False), 4) and verdict["answer"] == FAITHFUL
    assert response.headers["x-morphguard-action"] == "pass"
    row = rows(folder)[verdict["request_id"]]
    assert row["checked"] == 1 and row["answer"] == FAITHFUL and row["question"] == QUESTION
    assert row["context"] == PASSAGE and row["model"] == "gpt-4o-mini" and row["gateway"] is None


def test_a_caller_naming_its_gateway_gets_what_it_was_told_recorded(checker):
    base, folder = checker
    blocked = post(base, "/v1/check", {**check_body(HALLUCINATED), "gateway": "my-gateway"},
                   **{"x-tenant": "clinic"}).json()
    assert blocked["action"] == "block" and "gateway" not in blocked  # kept in the audit trail
    assert rows(folder)[blocked["request_id"]]["gateway"] == "my-gateway:deny"
    passed = post(base, "/v1/check", {**check_body(FAITHFUL), "gateway": "my-gateway"}).json()
    assert rows(folder)[passed["request_id"]]["gateway"] == "my-gateway:pass"


def test_a_hallucinated_answer_is_flagged_with_its_spans(checker):
    base, folder = checker
    verdict = post(base, "/v1/check", check_body(HALLUCINATED, context=PASSAGE)).json()  # context as one string
    assert verdict["flagged"] is True and verdict["action"] == "annotate"
    assert verdict["score"] == round(sentences_score(whole=True, sentence=True), 4)
    [claim] = verdict["factoids"]
    # the words the judge names as unsupported (the scripted judge: those the passage never uses)
    assert claim["flagged"] and HALLUCINATED[claim["start"]:claim["end"]] == "safe throughout"
    assert rows(folder)[verdict["request_id"]]["flagged"] == 1


def test_the_profile_decides_the_action_block_and_highlight(checker):
    base, folder = checker
    blocked = post(base, "/v1/check", check_body(HALLUCINATED), **{"x-tenant": "clinic"}).json()
    assert (blocked["profile"], blocked["action"], blocked["answer"]) == ("strict", "block", SAFE)
    assert "text" not in blocked["factoids"][0]  # where the blocked claim was, never its words
    marked = post(base, "/v1/check", check_body(HALLUCINATED), **{"x-tenant": "marked"}).json()
    assert marked["action"] == "highlight" and marked["answer"] == "Ibuprofen is [!safe throughout!] pregnancy."
    assert rows(folder)[blocked["request_id"]]["action"] == "block"


def test_the_model_a_check_names_cannot_choose_a_looser_profile(checker):
    """A route on models matches what a provider is asked for; a check's model is only the caller's word."""
    base, folder = checker
    verdict = post(base, "/v1/check", check_body(HALLUCINATED, model="internal-x"), key=CLINIC_KEY).json()
    assert (verdict["profile"], verdict["action"], verdict["answer"]) == ("strict", "block", SAFE)
    assert rows(folder)[verdict["request_id"]]["model"] == "internal-x"  # recorded as given
    hook = rag_hook(HALLUCINATED)
    hook["request"]["json"]["model"] = "internal-x"
    body = post(base, "/v1/check/portkey", hook, key=CLINIC_KEY).json()
    assert body["verdict"] is False and (body["data"]["profile"], body["data"]["action"]) == ("strict", "block")
    unrouted = post(base, "/v1/check", check_body(HALLUCINATED, model="internal-x")).json()
    assert (unrouted["profile"], unrouted["action"]) == ("general", "annotate")  # not `open`, which passes


@pytest.mark.parametrize("key", [None, "sk-not-a-proxy-key", "sk-proxy-check-01"])
def test_a_check_needs_a_proxy_key(checker, key):
    base, folder = checker
    before = len(rows(folder))
    response = post(base, "/v1/check", check_body(FAITHFUL), key=key)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"
    assert post(base, "/v1/check/portkey", {}, key=key).status_code == 401
    assert len(rows(folder)) == before  # refused before anything was accepted


@pytest.mark.parametrize("body, param", [
    (b"{not json", None),
    (b"[" * 100 + b"]" * 100, None),
    (b"[]", None),
    ({"context": [PASSAGE], "answer": FAITHFUL}, "question"),
    ({"question": QUESTION, "context": [PASSAGE], "answer": 12}, "answer"),
    ({"question": QUESTION, "context": [PASSAGE, 3], "answer": FAITHFUL}, "context"),
    ({"question": QUESTION, "context": ["  "], "answer": FAITHFUL}, "context"),
    ({"question": QUESTION, "answer": FAITHFUL}, "context"),
    ({**check_body(FAITHFUL), "model": ["gpt"]}, "model"),
    ({**check_body(FAITHFUL), "topic": {"a": 1}}, "topic"),
    ({**check_body(FAITHFUL), "gateway": "Nemo Guardrails"}, "gateway"),
    ({**check_body(FAITHFUL), "gateway": "n" * 33}, "gateway"),
    ({**check_body(FAITHFUL), "gateway": 7}, "gateway"),
])
def test_hostile_input_is_an_openai_shaped_400(checker, body, param):
    base, folder = checker
    before = len(rows(folder))
    response = post(base, "/v1/check", body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_request"
    assert error["param"] == param
    assert len(rows(folder)) == before


def portkey(name: str) -> dict[str, Any]:
    return json.loads((DATA / "portkey_webhook.json").read_text())[name]


def portkey_response_ok(body: Any) -> bool:
    """The webhook response Portkey reads: `verdict` a boolean; `transformedData.request` / `.response`, when
    present, objects whose `json` is an object (and `text` a string)."""
    if not isinstance(body, dict) or not isinstance(body.get("verdict"), bool):
        return False
    transformed = body.get("transformedData", {})
    if not isinstance(transformed, dict):
        return False
    for part in transformed.values():
        if not (isinstance(part, dict) and isinstance(part.get("json"), dict)
                and isinstance(part.get("text", ""), str)):
            return False
    return True


def test_the_shape_check_reads_portkeys_own_examples():
    for example in portkey("responses").values():
        assert portkey_response_ok(example)
    assert not portkey_response_ok({"data": {"verdict": True}})
    assert not portkey_response_ok({"verdict": "true"})


def test_portkey_before_request_is_a_pass_with_nothing_checked(checker):
    base, folder = checker
    before = len(rows(folder))
    response = post(base, "/v1/check/portkey", portkey("beforeRequestHook"))
    assert response.status_code == 200 and portkey_response_ok(response.json())
    assert response.json()["verdict"] is True and len(rows(folder)) == before


def test_portkeys_recorded_after_request_without_context_passes_unchecked_and_audited(checker):
    base, folder = checker
    response = post(base, "/v1/check/portkey", portkey("afterRequestHook"))
    assert response.status_code == 200 and portkey_response_ok(response.json())
    body = response.json()
    assert body["verdict"] is True and body["data"]["checked"] is False and body["data"]["reason"] == "no_context"
    assert "transformedData" not in body
    row = rows(folder)[body["data"]["request_id"]]
    assert row["reason"] == "no_context" and row["model"] == "gpt-4o-mini"


def rag_hook(answer: str, **metadata: str) -> dict[str, Any]:
    """Portkey's recorded afterRequestHook, as a RAG app sends it: the passage in the system message's
    <context> block, and the model's answer in the response."""
    hook = portkey("afterRequestHook")
    hook["request"]["json"]["messages"] = [
        {"role": "system", "content": f"Answer from the context.\n<context>{PASSAGE}</context>"},
        {"role": "user", "content": QUESTION}]
    hook["request"]["text"] = QUESTION
    hook["response"]["json"]["choices"][0]["message"]["content"] = answer
    hook["response"]["text"] = answer
    hook["metadata"].update(metadata)
    return hook


def test_portkey_after_request_with_a_grounded_answer_passes(checker):
    base, folder = checker
    body = post(base, "/v1/check/portkey", rag_hook(FAITHFUL)).json()
    assert portkey_response_ok(body) and body["verdict"] is True
    assert body["data"]["checked"] is True and body["data"]["flagged"] is False
    assert rows(folder)[body["data"]["request_id"]]["context_source"] == "tags"


def test_portkey_after_request_blocked_is_a_false_verdict_with_the_safe_message(checker):
    base, folder = checker
    response = post(base, "/v1/check/portkey", rag_hook(HALLUCINATED), **{"x-tenant": "clinic"})
    body = response.json()
    assert portkey_response_ok(body) and body["verdict"] is False
    assert body["data"]["action"] == "block" and body["data"]["flagged"] is True
    replaced = body["transformedData"]["response"]
    assert replaced["text"] == SAFE and replaced["json"]["choices"][0]["message"]["content"] == SAFE
    assert replaced["json"]["id"] == "chatcmpl-B9SAAj7zd4mq12omkeEImYvYnjbOr"  # the rest of the response is kept
    row = rows(folder)[body["data"]["request_id"]]
    assert row["action"] == "block" and row["answer"] == HALLUCINATED


def test_portkey_metadata_names_a_topic(checker):
    base, _ = checker
    body = post(base, "/v1/check/portkey", rag_hook(FAITHFUL, morphguard_topic="pregnancy")).json()
    assert body["data"]["topic"] == "pregnancy"


@pytest.mark.parametrize("change, param", [
    (lambda h: h.update(eventType="onTuesday"), "eventType"),
    (lambda h: h.pop("request"), "request"),
    (lambda h: h["request"].update(json=[1]), "request.json"),
    (lambda h: h["request"]["json"].update(messages="hi"), "request.json.messages"),
    (lambda h: h.update(response={"json": {"choices": []}}), "response.json.choices"),
    (lambda h: h["response"]["json"]["choices"][0]["message"].update(content=7),
     "response.json.choices[0].message.content"),
])
def test_portkey_hostile_input_is_an_openai_shaped_400(checker, change, param):
    base, folder = checker
    hook = rag_hook(FAITHFUL)
    change(hook)
    before = len(rows(folder))
    response = post(base, "/v1/check/portkey", hook)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    assert len(rows(folder)) == before


def test_portkey_request_types_it_cannot_read_are_decided_by_on_error_and_audited(checker):
    base, folder = checker
    body = post(base, "/v1/check/portkey", {**rag_hook(FAITHFUL), "requestType": "imageGenerate"}).json()
    assert body["verdict"] is True and body["data"]["checked"] is False  # the profile fails open (the default)
    assert body["data"]["reason"] == "fail_open: unsupported_request_type" and body["data"]["unchecked"] is True
    assert rows(folder)[body["data"]["request_id"]]["reason"] == "fail_open: unsupported_request_type"


@pytest.mark.parametrize("change", [lambda hook: hook.update(requestType="embed"),  # a type it cannot read
                                    lambda hook: hook["response"].update(json=None)],  # a stream: no answer relayed
                         ids=["embed", "stream"])
def test_under_a_blocking_profile_what_portkey_relays_unreadable_fails_closed(checker, change):
    base, folder = checker
    hook = rag_hook(HALLUCINATED)
    change(hook)
    response = post(base, "/v1/check/portkey", hook, **{"x-tenant": "clinic"})
    body = response.json()
    assert body["verdict"] is False and body["data"]["action"] == "block" and "unchecked" not in body["data"]
    assert body["data"]["reason"].startswith("fail_closed: ")
    row = rows(folder)[body["data"]["request_id"]]
    assert (row["action"], row["gateway"], row["unchecked"]) == ("block", "portkey:deny", 0)


def test_under_a_blocking_profile_a_choice_past_the_cap_fails_portkeys_verdict(checker):
    base, folder = checker
    hook = rag_hook(FAITHFUL)
    first = hook["response"]["json"]["choices"][0]
    hook["response"]["json"]["choices"] = [{**first, "index": i} for i in range(8)] + [
        {**first, "index": 8, "message": {"role": "assistant", "content": HALLUCINATED}}]
    body = post(base, "/v1/check/portkey", hook, **{"x-tenant": "clinic"}).json()
    assert body["verdict"] is False
    decided = [c for c in body["data"]["choices"] if not c["checked"]]
    assert [(c["action"], c["reason"]) for c in decided] == [("block", "fail_closed: too_many_choices")]


# A context of 4,000 sentences made of three common words and a number: every answer sentence of those words is
# compared with thousands of them, so a hundred pass alignment's bound of comparisons (`alignment.MAX_COMPARED`).
CROWDED = " ".join(f"Alpha {'beta' if n % 2 else 'gamma'} {n}." for n in range(4_000))
CROWDED_TAIL = " ".join(["Alpha beta gamma."] * 100)
INVENTED = "Zeta Corporation bought Omega Industries for 9,999 dollars in Berlin. "


@pytest.fixture(scope="module")
def grounding(provider, tmp_path_factory):  # noqa: F811
    """`morphguard serve` checking with `grounding` (no judge), its blocking profiles failing closed and open with no
    latency budget (the bound, not the time, ends the checks here)."""
    folder = tmp_path_factory.mktemp("grounding")
    config = gateway_config(provider, folder)
    config["detector"] = {"name": "grounding"}
    for name in ("closed", "open"):
        config["policy"]["profiles"][name]["latency_budget_s"] = None
    base, process = serve(config, folder)
    yield base, folder
    stop(process)


def crowded_check(base: str, answer: str, tenant: str) -> dict[str, Any]:
    body = {"question": "Alpha?", "context": [CROWDED], "answer": answer}
    response = post(base, "/v1/check", body, **{"x-tenant": tenant})
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("tenant", ["closed", "open"])
def test_past_alignments_bound_an_invented_claim_in_the_first_sentences_is_caught(grounding, tenant):
    base, folder = grounding
    verdict = crowded_check(base, INVENTED + CROWDED_TAIL, tenant)
    assert (verdict["action"], verdict["flagged"]) == ("block", True), json.dumps(verdict)
    assert verdict["reason"].endswith("check_too_large")
    assert rows(folder)[verdict["request_id"]]["action"] == "block"


def test_past_alignments_bound_an_honest_head_leaves_the_rest_to_on_error(grounding):
    base, folder = grounding
    closed = crowded_check(base, CROWDED_TAIL, "closed")
    assert (closed["action"], closed["reason"], closed["flagged"]) == ("block", "fail_closed: check_too_large", False)
    opened = crowded_check(base, CROWDED_TAIL, "open")
    assert (opened["action"], opened["reason"], opened["unchecked"]) == ("pass", "fail_open: check_too_large", True)
    assert opened["checked"] is True and opened["score"] is not None  # the first sentences were read
    assert rows(folder)[opened["request_id"]]["unchecked"] == 1
