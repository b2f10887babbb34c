"""Policy through the running proxy: actions, profile selection, topics, failures, escalation and the audit.

The judge is the scripted provider (exact, known verdicts); the client is the official `openai` SDK.
"""

from __future__ import annotations

import json
import subprocess
import time

import httpx
import openai
import pytest

from tests.e2e.conftest import ROOT
from tests.forked import run_command
from tests.scripted_llm import sentences_score

PASSAGE = "Ibuprofen is contraindicated in the third trimester of pregnancy."
IBUPROFEN_Q = "Can pregnant women take ibuprofen for back pain?"
ASYLUM_PASSAGE = "Refugees may receive protection after their asylum claim has been assessed."
ASYLUM_Q = "Do refugees get protection?"
MIDWIFE = "Please ask your midwife or doctor about medicines in pregnancy."


def profile(action: str, **extra: object) -> dict:
    return {"action": action, "topics": {}, **extra}


@pytest.fixture(scope="module")
def policy_proxy(proxy_factory, provider) -> str:
    base = provider.removesuffix("/v1")
    return proxy_factory(policy={
        "profiles": {
            "general": {"threshold": 0.5, "action": "annotate",
                        "topics": {"pregnancy": {"threshold": 0.3}, "migration": {"threshold": 0.175}}},
            **{a: profile(a) for a in ("pass", "highlight", "cite", "regenerate", "block")},
            # their own threshold as well, so that the topic named here is the strictest the request matches
            "maternity": profile("annotate", threshold=0.3,
                                 topics={"pregnancy": {"threshold": 0.3, "action": "block", "safe_message": MIDWIFE}}),
            "asylum": profile("annotate", threshold=0.175,
                              topics={"migration": {"threshold": 0.175, "action": "block", "escalate": True}}),
        },
        "routes": [
            *({"profile": a, "path_prefix": f"/{a}"} for a in ("pass", "highlight", "cite", "regenerate", "block")),
            {"profile": "maternity", "api_keys": ["clinic-key"]},
            {"profile": "maternity", "headers": {"x-tenant": "maternity-ward"}},
            {"profile": "asylum", "models": ["refug*"]},
        ],
        "highlight": {"open": "[!", "close": "!]"},
        "escalation": {"webhook_url": f"{base}/_webhook/flaky", "max_attempts": 4},
        "audit": {"store_text": "full"},
    })


def client(base: str, key: str = "sk-client", prefix: str = "", **headers: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}{prefix}/v1", api_key=key, max_retries=0, timeout=30,
                         default_headers=headers or None)


def ask(c: openai.OpenAI, model: str = "hallucinated", question: str = IBUPROFEN_Q, context: str = PASSAGE,
        **ours: str):
    return c.chat.completions.create(model=model, messages=[{"role": "user", "content": question}],
                                     extra_body={"morphguard": {"context": context, **ours}})


def verdict_of(completion) -> dict:
    return completion.model_extra["morphguard"]


def audit(proxy_factory, base: str, *args: str) -> subprocess.CompletedProcess[str]:
    config = proxy_factory.folders[base] / "config.yaml"
    return run_command(["audit", "--config", str(config), *args], cwd=ROOT, timeout=60)


# --- actions -----------------------------------------------------------------------------------------------

def test_pass_leaves_a_flagged_answer_as_it_is(policy_proxy):
    completion = ask(client(policy_proxy, prefix="/pass"))
    verdict = verdict_of(completion)
    assert verdict["profile"] == "pass" and verdict["flagged"] and verdict["action"] == "pass"
    assert completion.choices[0].message.content == "Ibuprofen is safe throughout pregnancy."


def test_annotate_flags_without_touching_the_answer(policy_proxy):
    completion = ask(client(policy_proxy))
    verdict = verdict_of(completion)
    assert (verdict["profile"], verdict["topic"], verdict["threshold"]) == ("general", "pregnancy", 0.3)
    assert verdict["action"] == "annotate" and verdict["factoids"][0]["flagged"]
    assert completion.choices[0].message.content == "Ibuprofen is safe throughout pregnancy."


def test_highlight_marks_the_flagged_span(policy_proxy):
    completion = ask(client(policy_proxy, prefix="/highlight"))
    # the phrase the judge names (the scripted judge: the words the passage never uses), not its whole sentence
    assert completion.choices[0].message.content == "Ibuprofen is [!safe throughout!] pregnancy."
    assert verdict_of(completion)["action"] == "highlight"


def test_cite_appends_what_the_context_says_of_each_flagged_phrase(policy_proxy):
    """Cite looks up a source for each flagged span: with `sentences`, the phrases the judge names, each looked up by
    the sentence it stands in ("safe throughout" alone shares no word with the passage)."""
    content = ask(client(policy_proxy, prefix="/cite")).choices[0].message.content
    assert content == ("Ibuprofen is safe throughout pregnancy.\n\nChecked against the sources:\n"
                       '- "Ibuprofen is safe throughout pregnancy." (flagged: "safe throughout"): '
                       'source [1] says "Ibuprofen is contraindicated in the third trimester of pregnancy."')


def test_cite_says_when_no_source_bears_on_a_claim(policy_proxy):
    reply = ask(client(policy_proxy, prefix="/cite"), context="Paracetamol is widely used.")
    content = reply.choices[0].message.content
    assert content.endswith('- "Ibuprofen is safe throughout pregnancy." (flagged: "Ibuprofen", '
                            '"safe throughout pregnancy"): no retrieved source supports this.')


def test_regenerate_reasks_with_the_unsupported_claims_and_keeps_the_better_answer(policy_proxy, provider):
    completion = ask(client(policy_proxy, prefix="/regenerate"))
    verdict = verdict_of(completion)
    assert completion.choices[0].message.content == PASSAGE
    assert verdict["action"] == "regenerate" and verdict["regenerations"] == 1
    assert not verdict["flagged"] and verdict["score"] == round(sentences_score(whole=False, sentence=False), 4)
    reask = [r["body"] for r in httpx.get(provider.removesuffix("/v1") + "/_requests").json()
             if "Answer again" in str(r["body"]["messages"][-1].get("content"))][-1]
    assert '"safe throughout"' in reask["messages"][-1]["content"]  # the phrase the judge names
    assert "morphguard" not in reask


def test_block_replaces_the_answer_with_the_safe_message(policy_proxy):
    completion = ask(client(policy_proxy, prefix="/block"))
    assert completion.choices[0].finish_reason == "stop" and completion.choices[0].message.refusal
    assert completion.choices[0].message.content.startswith("I can't give a reliable answer")


def test_a_faithful_answer_passes_every_profile(policy_proxy):
    completion = ask(client(policy_proxy, prefix="/block"), model="faithful")
    assert verdict_of(completion)["action"] == "pass" and completion.choices[0].message.content == PASSAGE


# --- the paper's two worked cases and profile selection ------------------------------------------------------

def test_ibuprofen_in_pregnancy_is_blocked_under_the_maternity_profile_chosen_by_key(policy_proxy):
    completion = ask(client(policy_proxy, key="clinic-key"))
    verdict = verdict_of(completion)
    assert (verdict["profile"], verdict["topic"], verdict["action"]) == ("maternity", "pregnancy", "block")
    assert completion.choices[0].message.content == MIDWIFE
    # the same request with another key falls to the general profile: flagged, annotated, not blocked
    general = ask(client(policy_proxy, key="other-key"))
    assert verdict_of(general)["action"] == "annotate"


def test_profile_chosen_by_header(policy_proxy):
    verdict = verdict_of(ask(client(policy_proxy, **{"x-tenant": "maternity-ward"})))
    assert verdict["profile"] == "maternity" and verdict["action"] == "block"


def test_refugees_answer_scoring_between_thresholds_is_flagged_under_asylum_and_a_requested_topic_cannot_loosen_it(
        policy_proxy, provider):
    c = client(policy_proxy)
    asylum = ask(c, model="refugee", question=ASYLUM_Q, context=ASYLUM_PASSAGE)
    verdict = verdict_of(asylum)
    assert verdict["profile"] == "asylum"  # chosen by the model glob "refug*"
    # its one sentence unsupported, the answer as a whole supported (the scripted judge)
    between = round(sentences_score(whole=False, sentence=True), 4)
    assert 0.175 < between < 0.5  # flagged under the asylum profile's threshold, not under the general one
    assert verdict["topic"] == "migration" and verdict["score"] == between and verdict["threshold"] == 0.175
    assert verdict["flagged"] and verdict["action"] == "block" and verdict["escalated"]
    # the escalation reached the webhook on its third attempt (two 503s first)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        received = httpx.get(provider.removesuffix("/v1") + "/_webhooks").json()
        if any(w["kind"] == "flaky" for w in received):
            break
        time.sleep(0.2)
    hook = next(w for w in received if w["kind"] == "flaky")
    assert hook["attempt"] == 3
    assert hook["body"]["request_id"] == verdict["request_id"] and hook["body"]["topic"] == "migration"
    assert "answer" not in hook["body"]  # the webhook gets the decision, not the text
    # a topic named by the request is one more candidate, never a way out of the stricter tagged one
    for named in ("general", "none", "finance"):
        g = verdict_of(ask(c, model="refugee", question=ASYLUM_Q, context=ASYLUM_PASSAGE, topic=named))
        assert (g["topic"], g["threshold"], g["flagged"], g["action"]) == ("migration", 0.175, True, "block")


def test_topic_header_can_make_policy_stricter_but_not_looser(policy_proxy):
    looser = verdict_of(ask(client(policy_proxy, **{"x-morphguard-topic": "finance"})))
    assert looser["topic"] == "pregnancy" and looser["threshold"] == 0.3  # the tagged topic is stricter
    stricter = verdict_of(ask(client(policy_proxy, **{"x-morphguard-topic": "pregnancy"}),
                              question="What does the leaflet say?", context="The leaflet lists opening hours."))
    assert stricter["topic"] == "pregnancy" and stricter["threshold"] == 0.3


def test_audit_lists_filters_and_exports(policy_proxy, proxy_factory):
    ask(client(policy_proxy, prefix="/block"))
    ask(client(policy_proxy), model="faithful")
    jsonl = audit(proxy_factory, policy_proxy, "--flagged", "--format", "jsonl")
    assert jsonl.returncode == 0, jsonl.stderr
    rows = [json.loads(line) for line in jsonl.stdout.splitlines()]
    assert rows and all(r["flagged"] for r in rows)
    blocked = [r for r in rows if r["profile"] == "block"][-1]
    assert blocked["action"] == "block" and blocked["score"] == round(sentences_score(whole=True, sentence=True), 4)
    assert blocked["topic"] == "pregnancy"
    # store_text: full; the audit keeps the model's answer, not the safe message the client got
    assert blocked["answer"] == "Ibuprofen is safe throughout pregnancy." and blocked["question"] == IBUPROFEN_Q
    assert [f["text"] for f in blocked["factoids"]] == ["safe throughout"]  # the phrase the judge names
    assert blocked["cost"]["llm_calls"] + blocked["cost"]["cached_calls"] == 1  # one sentence: one batch
    topic = audit(proxy_factory, policy_proxy, "--topic", "migration", "--format", "csv")
    lines = topic.stdout.splitlines()
    assert lines[0].startswith("id,time,request_id") and len(lines) > 1
    assert all(",migration," in row for row in lines[1:])
    out = proxy_factory.folders[policy_proxy] / "export.jsonl"
    assert audit(proxy_factory, policy_proxy, "--since", "1h", "--out", str(out), "--format", "jsonl").returncode == 0
    assert len(out.read_text().splitlines()) >= len(rows)
    table = audit(proxy_factory, policy_proxy, "--not-flagged")
    assert "faithful" not in table.stdout and " pass " in table.stdout


# --- failures --------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def broken_judge_proxy(proxy_factory, provider) -> str:
    base = provider.removesuffix("/v1")
    return proxy_factory(judge_model="openai/broken-judge", policy={
        "profiles": {"general": profile("annotate", on_error="fail_open"),
                     "strict": profile("annotate", on_error="fail_closed", escalate=True)},
        "routes": [{"profile": "strict", "headers": {"x-tenant": "strict"}}],
        "escalation": {"webhook_url": f"{base}/_webhook/down", "max_attempts": 2},
    })


def test_fail_open_passes_the_answer_unchecked_and_says_why(broken_judge_proxy, proxy_factory):
    completion = ask(client(broken_judge_proxy))
    verdict = verdict_of(completion)
    assert not verdict["checked"] and verdict["action"] == "pass"
    assert verdict["reason"] == "fail_open: judge_error"  # a stable code; the details stay in the log
    assert completion.choices[0].message.content == "Ibuprofen is safe throughout pregnancy."
    exported = audit(proxy_factory, broken_judge_proxy, "--format", "jsonl").stdout
    rows = [json.loads(line) for line in exported.splitlines()]
    assert rows[-1]["reason"].startswith("fail_open") and rows[-1]["checked"] is False
    assert verdict["unchecked"] is True and rows[-1]["unchecked"] is True
    log = (proxy_factory.folders[broken_judge_proxy] / "proxy.log").read_text()
    assert "passed unchecked (fail_open: judge_error)" in log and "sk-judge" not in log


def test_fail_closed_blocks_and_an_undeliverable_escalation_is_kept(broken_judge_proxy, proxy_factory):
    completion = ask(client(broken_judge_proxy, **{"x-tenant": "strict"}))
    verdict = verdict_of(completion)
    assert verdict["action"] == "block" and verdict["reason"].startswith("fail_closed")
    assert completion.choices[0].message.refusal and completion.choices[0].finish_reason == "stop"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        kept = audit(proxy_factory, broken_judge_proxy, "--undelivered").stdout.splitlines()
        if kept:
            break
        time.sleep(0.3)
    record = json.loads(kept[-1])
    assert record["attempts"] == 2 and "503" in record["error"]
    assert record["payload"]["request_id"] == verdict["request_id"]


@pytest.mark.slow  # ten seconds or more of its own
def test_a_check_over_the_latency_budget_fails_closed_under_a_blocking_profile_unless_it_says_fail_open(
        proxy_factory):
    base = proxy_factory(judge_model="openai/slow-judge", policy={
        "profiles": {"general": profile("block", latency_budget_s=0.5),
                     "lenient": profile("block", latency_budget_s=0.5, on_error="fail_open")},
        "routes": [{"profile": "lenient", "headers": {"x-tenant": "lenient"}}]})
    blocked = ask(client(base))
    verdict = verdict_of(blocked)
    assert verdict["action"] == "block" and verdict["reason"] == "fail_closed: latency_budget_exceeded"
    assert "safe throughout" not in (blocked.choices[0].message.content or "") and "unchecked" not in verdict
    raw = client(base, **{"x-tenant": "lenient"}).chat.completions.with_raw_response.create(
        model="hallucinated", messages=[{"role": "user", "content": IBUPROFEN_Q}],
        extra_body={"morphguard": {"context": PASSAGE}})
    verdict = verdict_of(raw.parse())
    assert verdict["action"] == "pass" and verdict["reason"] == "fail_open: latency_budget_exceeded"
    assert verdict["unchecked"] is True and raw.headers["x-morphguard-unchecked"] == "true"


@pytest.mark.slow  # ten seconds or more of its own
def test_an_escalation_given_up_on_is_sent_again_on_demand(proxy_factory, provider):
    """The webhook stays down past `retry_for_s` (0 here: no retries), the escalation waits undelivered; once the
    webhook is back, `morphguard audit --redeliver` makes it due and the running proxy's sweep sends it."""
    gate = f"redeliver-{time.monotonic_ns()}"
    root = provider.removesuffix("/v1")
    base = proxy_factory(policy={
        "profiles": {"general": {"action": "annotate", "escalate": True, "topics": {}}},
        "escalation": {"webhook_url": f"{root}/_webhook/gate-{gate}", "max_attempts": 1, "timeout_s": 1,
                       "claim_timeout_s": 7, "retry_for_s": 0}})
    request_id = verdict_of(ask(client(base)))["request_id"]
    deadline = time.monotonic() + 30
    while request_id not in audit(proxy_factory, base, "--undelivered").stdout:
        assert time.monotonic() < deadline, "the escalation was never recorded as undelivered"
        time.sleep(0.5)
    httpx.post(f"{root}/_gate/{gate}", timeout=5)
    assert "1 undelivered escalations are due again" in audit(proxy_factory, base, "--redeliver").stdout
    while not any(h["kind"] == f"gate-{gate}" and h["body"]["request_id"] == request_id
                  for h in httpx.get(f"{root}/_webhooks", timeout=5).json()):
        assert time.monotonic() < deadline + 30, "the escalation was not sent again"
        time.sleep(0.5)
    assert audit(proxy_factory, base, "--undelivered").stdout == ""
