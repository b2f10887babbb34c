"""A shadow candidate beside the live check, through the running proxy: whatever the candidate does (errs, hangs,
blocks everything), the client gets the same bytes as from a proxy without one; its verdict lands beside the live
decision, disagreements keep their texts for review, its metrics count it, and `replay --shadow` reports it.

The judge is the scripted provider; the client is the official `openai` SDK.
"""

from __future__ import annotations

import json
import re
import sqlite3
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.commands import morphguard

CONTEXT = "Ibuprofen is contraindicated in the third trimester of pregnancy."
QUESTION = "Can pregnant women take ibuprofen for back pain?"
# the live profile annotates what it flags; each candidate changes one thing
CANDIDATES = {
    "errs": {"judge": {"model": "openai/broken-judge"}},
    "hangs": {"judge": {"model": "openai/slow-judge"}},
    "blocks": {"policy": {"profiles": {"general": {"threshold": 0.0, "action": "block"}}}},  # decides on the finding
    "grounds": {"detector": {"name": "grounding"}},  # checks every answer again, with another detector
}
MODELS = ("faithful", "hallucinated")


@pytest.fixture(scope="module")
def proxies(proxy_factory):
    policy = {"profiles": {"general": {"threshold": 0.5, "action": "annotate", "topics": {}}}}
    live = proxy_factory(policy=policy, telemetry={"prometheus": True})
    shadowed = {name: proxy_factory(policy=policy, telemetry={"prometheus": True},
                                    shadow={"name": name, "sample": 1.0, "candidate": candidate, "timeout_s": 1.0})
                for name, candidate in CANDIDATES.items()}
    return live, shadowed


def _ask(base: str, model: str, stream: bool) -> tuple[bytes, dict[str, str]]:
    """The response as the client receives it, with what differs between any two requests (ids, times) taken out."""
    body = {"model": model, "stream": stream, "messages": [
        {"role": "system", "content": f"Answer from <context>{CONTEXT}</context>"},
        {"role": "user", "content": QUESTION}]}
    response = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=30,
                          headers={"authorization": "Bearer sk-client"})
    assert response.status_code == 200, response.text
    text = response.content.decode()
    request_id = re.search(r'"request_id":\s*"([0-9a-f]+)"', text).group(1)  # in the verdict, streamed or not
    text = text.replace(request_id, "<request>")
    headers = {k: v.replace(request_id, "<request>") for k, v in response.headers.items()
               if k not in ("date", "content-length")}
    return _without_volatile(text).encode(), headers


def _without_volatile(text: str) -> str:
    text = re.sub(r'"(created|created_at)":\s*\d+', '"\\1": 0', text)
    text = re.sub(r'"id":\s*"[^"]*"', '"id": ""', text)
    return re.sub(r'"(latency_ms)":\s*\d+', '"\\1": 0', text)


def _shadow_rows(proxy_factory, base: str, count: int) -> list[dict]:
    deadline = time.monotonic() + 20
    while True:
        with sqlite3.connect(proxy_factory.folders[base] / "audit.db") as db:
            db.row_factory = sqlite3.Row
            rows = [dict(r) for r in db.execute(
                "SELECT v.*, d.action AS live_action, d.question, d.answer FROM shadow_verdicts v "
                "JOIN decisions d ON d.request_id = v.request_id")]
        if len(rows) >= count or time.monotonic() > deadline:
            return rows
        time.sleep(0.1)


def _metric(base: str) -> dict[str, float]:
    text = httpx.get(base + "/metrics", timeout=10).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    return {s.labels["morphguard_shadow_outcome"]: s.value for s in families["morphguard_shadow_checks"].samples
            if s.name.endswith("_total")}


@pytest.mark.parametrize("candidate", sorted(CANDIDATES))
def test_a_candidate_changes_no_response_byte(proxies, candidate):
    live, shadowed = proxies
    for model in MODELS:
        for stream in (False, True):
            assert _ask(shadowed[candidate], model, stream) == _ask(live, model, stream), (model, stream)


def test_a_blocking_candidate_is_stored_beside_the_live_decision_and_reported(proxies, proxy_factory):
    _, shadowed = proxies
    base = shadowed["blocks"]
    for model in MODELS:
        _ask(base, model, False)
    deadline = time.monotonic() + 20
    while True:  # every request this proxy answered, compared by the candidate and stored
        counted = sum(_metric(base).values())
        rows = _shadow_rows(proxy_factory, base, int(counted))
        if len(rows) == counted >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert {(r["live_action"], r["action"], r["changed"]) for r in rows} == {
        ("annotate", "block", 1), ("pass", "block", 1)}
    # a candidate that changes policy alone decides on the live finding, asking no judge
    live = {r["request_id"]: r for r in _live_rows(proxy_factory, base)}
    for row in rows:
        outcome = json.loads(row["outcome"])
        assert outcome["llm_calls"] == 0 and outcome["score"] == live[row["request_id"]]["score"]
    # the disagreement keeps its texts for review although the live decision passed it (store_text: hash)
    passed = next(r for r in rows if r["live_action"] == "pass")
    assert passed["question"] == QUESTION and passed["answer"] and not passed["answer"].startswith("sha256:")
    assert _metric(base) == {"disagree": len(rows)}
    folder = proxy_factory.folders[base]
    result = morphguard("replay", "--config", "config.yaml", "--shadow", "--out", "shadow", cwd=folder)
    assert result.returncode == 0, result.stderr
    report = json.loads((folder / "shadow" / "report.json").read_text())
    moves = {(m["live"], m["candidate"]): m["n"] for m in report["moves"]}
    assert moves[("pass", "block")] >= 1 and moves[("annotate", "block")] >= 1
    assert report["would_block"] == report["rows"]


def _hallucinated(base: str) -> None:
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-client", max_retries=0, timeout=30)
    completion = client.chat.completions.create(model="hallucinated", messages=[
        {"role": "system", "content": f"Answer from <context>{CONTEXT}</context>"},
        {"role": "user", "content": QUESTION}])
    assert completion.model_extra["morphguard"]["checked"]


def test_a_candidate_whose_judge_fails_is_decided_by_its_on_error(proxies, proxy_factory):
    """What the candidate would have done live: its check failed, so its profile's on_error decided."""
    _, shadowed = proxies
    base = shadowed["errs"]
    _hallucinated(base)
    rows = _shadow_rows(proxy_factory, base, 1)
    assert rows and all(json.loads(r["outcome"])["reason"].startswith("fail_open: ") for r in rows)
    assert all(r["action"] == "pass" for r in rows)


def test_a_candidate_that_hangs_is_cut_off_counted_and_stores_nothing(proxies, proxy_factory):
    _, shadowed = proxies
    base = shadowed["hangs"]
    _hallucinated(base)
    deadline = time.monotonic() + 20
    while _metric(base).get("failed", 0) < 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _metric(base).get("failed", 0) >= 1
    assert _shadow_rows(proxy_factory, base, 0) == []


def test_a_candidate_with_another_detector_checks_the_answer_itself(proxies, proxy_factory):
    _, shadowed = proxies
    base = shadowed["grounds"]
    for model in MODELS:
        _ask(base, model, False)
    rows = _shadow_rows(proxy_factory, base, 2)
    outcomes = [json.loads(r["outcome"]) for r in rows]
    assert {o["score"] is not None for o in outcomes} == {True}
    # grounding's own score, not the live check's copied across
    live = {r["request_id"]: r for r in _live_rows(proxy_factory, base)}
    assert any(o["score"] != live[o["request_id"]]["score"] for o in outcomes)


def _live_rows(proxy_factory, base: str) -> list[dict]:
    with sqlite3.connect(proxy_factory.folders[base] / "audit.db") as db:
        db.row_factory = sqlite3.Row
        return [dict(r) for r in db.execute("SELECT request_id, score FROM decisions")]
