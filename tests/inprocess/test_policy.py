"""Policy's decisions through the app in process: the profile a route, key or header chooses, a topic's threshold,
each action carried out, a check run after the answer went out (the queue and its consumer in process), and the
audit row each request leaves."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.inprocess.conftest import BASE, InProcess
from tests.scripted_llm import sentences_score

pytestmark = pytest.mark.anyio

PASSAGE = "Ibuprofen is contraindicated in the third trimester of pregnancy."
QUESTION = "Can pregnant women take ibuprofen for back pain?"
HALLUCINATED = "Ibuprofen is safe throughout pregnancy."
MIDWIFE = "Please ask your midwife or doctor about medicines in pregnancy."
CHECK_KEY = "mg-check-key-0001"


def profile(action: str, **extra: object) -> dict[str, Any]:
    return {"action": action, "topics": {}, **extra}


@pytest.fixture(scope="module")
async def app(in_process) -> InProcess:
    return await in_process(keys=[CHECK_KEY], policy={
        "profiles": {
            "general": {"threshold": 0.5, "action": "annotate", "topics": {"pregnancy": {"threshold": 0.3}}},
            **{a: profile(a) for a in ("pass", "highlight", "regenerate", "block")},
            "maternity": profile("annotate", threshold=0.3,
                                 topics={"pregnancy": {"threshold": 0.3, "action": "block", "safe_message": MIDWIFE}}),
        },
        "routes": [
            *({"profile": a, "path_prefix": f"/{a}"} for a in ("pass", "highlight", "regenerate", "block")),
            {"profile": "maternity", "api_keys": ["clinic-key"]},
            {"profile": "maternity", "headers": {"x-tenant": "maternity-ward"}},
        ],
        "highlight": {"open": "[!", "close": "!]"},
    })


@pytest.fixture(scope="module")
async def later(in_process) -> InProcess:
    return await in_process(mode="async", stream_mode="async")


def client(app: InProcess, key: str = "sk-client", prefix: str = "", **headers: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{BASE}{prefix}/v1", api_key=key, max_retries=0, http_client=app.client,
                              default_headers=headers or None)


async def ask(c: openai.AsyncOpenAI, model: str = "hallucinated", **ours: str) -> Any:
    return await c.chat.completions.create(model=model, messages=[{"role": "user", "content": QUESTION}],
                                           extra_body={"morphguard": {"context": PASSAGE, **ours}})


async def test_the_general_profile_annotates_under_the_tagged_topics_threshold(app):
    completion = await ask(client(app))
    verdict = completion.model_extra["morphguard"]
    assert (verdict["profile"], verdict["topic"], verdict["threshold"]) == ("general", "pregnancy", 0.3)
    assert verdict["flagged"] and verdict["action"] == "annotate"
    assert completion.choices[0].message.content == HALLUCINATED
    row = app.row(verdict["request_id"])
    assert (row["profile"], row["topic"], row["threshold"], row["action"]) == ("general", "pregnancy", 0.3, "annotate")


@pytest.mark.parametrize(("prefix", "content"), [
    ("/pass", HALLUCINATED),
    ("/highlight", "Ibuprofen is [!safe throughout!] pregnancy."),
    ("/regenerate", PASSAGE),
])
async def test_each_action_is_carried_out_on_the_answer(app, prefix, content):
    completion = await ask(client(app, prefix=prefix))
    verdict = completion.model_extra["morphguard"]
    assert verdict["profile"] == verdict["action"] == prefix.strip("/")
    assert completion.choices[0].message.content == content
    assert app.row(verdict["request_id"])["action"] == verdict["action"]


async def test_regenerate_keeps_the_better_answer_and_says_how_often_it_asked_again(app):
    verdict = (await ask(client(app, prefix="/regenerate"))).model_extra["morphguard"]
    assert verdict["regenerations"] == 1 and not verdict["flagged"]
    assert verdict["score"] == round(sentences_score(whole=False, sentence=False), 4)
    assert app.row(verdict["request_id"])["regenerations"] == 1


async def test_block_withholds_the_answer_and_a_faithful_one_passes(app):
    blocked = await ask(client(app, prefix="/block"))
    assert blocked.choices[0].message.content.startswith("I can't give a reliable answer")
    faithful = await ask(client(app, prefix="/block"), model="faithful")
    assert faithful.choices[0].message.content == PASSAGE
    assert faithful.model_extra["morphguard"]["action"] == "pass"
    rows = [app.row(c.model_extra["morphguard"]["request_id"]) for c in (blocked, faithful)]
    assert [(r["flagged"], r["action"]) for r in rows] == [(1, "block"), (0, "pass")]


async def test_a_key_or_a_header_chooses_the_profile_and_its_topic_blocks(app):
    by_key = await ask(client(app, key="clinic-key"))
    by_header = await ask(client(app, **{"x-tenant": "maternity-ward"}))
    for completion in (by_key, by_header):
        verdict = completion.model_extra["morphguard"]
        assert (verdict["profile"], verdict["topic"], verdict["action"]) == ("maternity", "pregnancy", "block")
        assert completion.choices[0].message.content == MIDWIFE
    assert (await ask(client(app, key="other-key"))).model_extra["morphguard"]["action"] == "annotate"


async def test_a_requested_topic_cannot_loosen_the_tagged_one(app):
    verdict = (await ask(client(app, **{"x-morphguard-topic": "finance"}))).model_extra["morphguard"]
    assert (verdict["topic"], verdict["threshold"], verdict["flagged"]) == ("pregnancy", 0.3, True)


async def test_a_check_of_an_answer_the_caller_has_is_decided_and_audited_with_its_gateway(app):
    body = {"question": QUESTION, "context": [PASSAGE], "answer": HALLUCINATED, "gateway": "nemo"}
    refused = await app.client.post("/v1/check", json=body)
    assert refused.status_code == 401 and refused.json()["error"]["code"]
    response = await app.client.post("/v1/check", json=body, headers={"authorization": f"Bearer {CHECK_KEY}"})
    assert response.status_code == 200
    decision = response.json()
    assert decision["flagged"] and decision["action"] == "annotate"
    row = app.row(decision["request_id"])
    assert row["gateway"] == "nemo:pass" and row["flagged"] == 1


async def test_a_check_run_after_the_answer_went_out_writes_its_row_from_the_queue(later):
    completion = await ask(client(later))
    verdict = completion.model_extra["morphguard"]
    assert (verdict["checked"], verdict["reason"], verdict["action"]) == (False, "queued", "pass")
    assert completion.choices[0].message.content == HALLUCINATED
    row = await later.row_in_time(verdict["request_id"])  # the consumer's, once it has checked
    assert (row["checked"], row["flagged"]) == (1, 1)


async def test_a_bad_request_is_an_openai_error_and_a_failed_upstream_leaves_a_row(app):
    bad = await app.client.post("/v1/chat/completions", content=b"{not json",
                                headers={"content-type": "application/json"})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    with pytest.raises(openai.InternalServerError) as failed:
        await ask(client(app), model="fail-500")
    assert failed.value.status_code == 502
    row = app.rows("model = ?", "fail-500")[-1]
    assert row["checked"] == 0 and row["reason"] == failed.value.body["code"]
