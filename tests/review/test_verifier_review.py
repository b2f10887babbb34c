"""From a verifier's check to the console: the proxy (under uvicorn) checks an answer with a tiny claim classifier
made in the test (tests/verifier_models.py); the audit row keeps the flagged sentence with the window that decided
it, and the console's detail page names the model and the window."""

from __future__ import annotations

import html
import re

from morphguard.config import AuditSettings, Config, ReviewSettings
from morphguard.policy.audit import AuditStore
from morphguard.review.app import ReviewConsole
from tests.review.conftest import Console, serving
from tests.review.test_reasons_flow import ask_in_process
from tests.scripted_llm import ScriptedLLM, completion
from tests.verifier_models import save

PASSAGE = "Ibuprofen is contraindicated in the third trimester of pregnancy."
ANSWER = "Ibuprofen is contraindicated in the third trimester. Ibuprofen is safe throughout pregnancy."


def test_the_model_and_window_that_decided_reach_the_reviewer(tmp_path):
    model = save(tmp_path / "model", "claims", [PASSAGE, ANSWER])
    audit = tmp_path / "audit.db"
    with ScriptedLLM(lambda body: completion(ANSWER)) as upstream:
        config = Config.model_validate({
            "judge": {"runtime": "onnx", "model": str(model)},
            "verifier": {"threads": 1},
            "proxy": {"upstream": {"base_url": upstream.base_url}},
            "policy": {"audit": {"path": str(audit)}},
        })
        verdict = ask_in_process(config, "Can pregnant women take ibuprofen?", PASSAGE)
    assert verdict["detector"] == "verifier" and verdict["flagged"] is True

    store = AuditStore(AuditSettings(path=str(audit)))
    try:
        (row,) = store.query()
        (flagged,) = [f for f in row["factoids"] if f["flagged"]]
        assert flagged["text"] == "Ibuprofen is safe throughout pregnancy."
        assert "window 1 of 1" in flagged["reason"] and flagged["evidence"][0]["passage"] == 1
        (step,) = row["explanation"]
        assert step["step"] == "verifier" and str(model) in step["text"]
        with serving(ReviewConsole(ReviewSettings(secure_cookies=False), lambda: store, {"alice": "k"})) as base:
            page = html.unescape(Console(base, store, {}, key="k").login().get(f"/decisions/{row['id']}").text)
    finally:
        store.close()
    (steps,) = re.findall(r'<ol class="explanation">(.*?)</ol>', page, re.S)
    assert str(model) in steps and "window 1 of 1 (passage 1, characters 0-65)" in steps
    assert f"{model}: supported with probability 0.00 at most, in window 1 of 1" in page
