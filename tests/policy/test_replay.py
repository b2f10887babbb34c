"""`morphguard replay`: a store with known rows and reviews, replayed under a candidate, gives the table, the scores
against the labels and the changed decisions those rows imply, on SQLite and PostgreSQL; at depth `check` the kept
texts go through the candidate's detector and rows without them are counted; a rerun continues where a run stopped."""

from __future__ import annotations

import json

import pytest
import yaml

from morphguard.config import AuditSettings, StoreSettings
from morphguard.policy.audit import AuditStore
from morphguard.policy.record import DecisionRecord
from morphguard.policy.reviews import ReviewStore
from tests.commands import morphguard

CONTEXT = "The museum opens at nine on weekdays.\n\nEntry is free for children under twelve."
KEPT = {"question": "When does the museum open?", "context": CONTEXT}


def _rows() -> list[tuple[DecisionRecord, str | None]]:
    """(row, review label) as the live proxy left them under the general profile (τ 0.3, annotate)."""
    checked = {"checked": True, "threshold": 0.3, "detector": "sentences"}
    return [
        (DecisionRecord(request_id="high", profile="general", topic="general", score=0.9, flagged=True,
                        action="annotate", **checked, **KEPT, answer="The museum opens at noon on Sundays only."),
         "hallucinated"),
        (DecisionRecord(request_id="border", profile="general", topic="general", score=0.35, flagged=True,
                        action="annotate", **checked, **KEPT, answer="The museum opens at nine on weekdays."),
         "faithful"),
        (DecisionRecord(request_id="missed", profile="general", topic="general", score=0.2, flagged=False,
                        action="pass", **checked), "hallucinated"),
        (DecisionRecord(request_id="low", profile="general", topic="general", score=0.05, flagged=False,
                        action="pass", **checked), None),
        (DecisionRecord(request_id="nocontext", profile="general", topic="general", threshold=0.3,
                        reason="no_context"), None),
        (DecisionRecord(request_id="timeout", profile="general", topic="general", threshold=0.3,
                        reason="fail_open: judge_timeout"), None),
        (DecisionRecord(request_id="queued", profile="general", topic="general"), None),
    ]


@pytest.fixture(params=["sqlite", "postgresql"])
def setup(request, tmp_path):
    url = None if request.param == "sqlite" else request.getfixturevalue("postgres_url")
    config = {"policy": {"audit": {"path": str(tmp_path / "audit.db"), "store_text": "full"}},
              "store": {"url": url}}
    store = AuditStore(AuditSettings(**config["policy"]["audit"]), StoreSettings(url=url))
    reviews = ReviewStore(store)
    for record, label in _rows():
        row_id = store.record(record)
        if label:
            reviews.judge(row_id, "ana", label)
    store.close()
    (tmp_path / "live.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    return tmp_path


def _candidate(folder, text: str) -> str:
    (folder / "candidate.yaml").write_text(text, encoding="utf-8")
    return "candidate.yaml"


def _replay(folder, *args: str):
    result = morphguard("replay", "--config", "live.yaml", *args, cwd=folder)
    assert result.returncode == 0, result.stderr
    return result


def test_decide_reapplies_the_candidate_policy_to_stored_findings(setup):
    candidate = _candidate(setup, "policy:\n  profiles:\n    general:\n      threshold: 0.15\n      action: block\n"
                                  "      on_error: fail_closed\n")
    result = _replay(setup, "--candidate", candidate, "--out", "run")
    report = json.loads((setup / "run" / "report.json").read_text())
    moves = {(m["live"], m["candidate"]): m["n"] for m in report["moves"]}
    # 0.9 and 0.35 stay flagged, now blocked; 0.2 is now flagged; 0.05 passes; no context passes; the judge
    # timeout now fails closed; the queued row has no verdict to replay
    assert moves == {("annotate", "block"): 2, ("pass", "block"): 2, ("pass", "pass"): 2}
    assert report["status"] == {"decided": 6, "pending": 1}
    assert report["labelled"]["live"] == {"n": 3, "hallucinated": 2, "precision": 0.5, "recall": 0.5, "f1": 0.5}
    assert report["labelled"]["candidate"]["recall"] == 1.0 and report["labelled"]["candidate"]["n"] == 3
    assert report["cost"]["llm_calls"] == 0
    changed = [json.loads(line) for line in (setup / "run" / "changed.jsonl").read_text().splitlines()]
    assert {c["request_id"] for c in changed} == {"high", "border", "missed", "timeout"}
    assert "live \\ cand." in result.stdout and "would block 4" in result.stdout


def test_the_candidate_keeps_what_it_does_not_name(setup):
    """A candidate naming one profile's threshold keeps the live topics' stricter rules (laid over, not replaced)."""
    candidate = _candidate(setup, "policy:\n  profiles:\n    general:\n      threshold: 0.95\n")
    _replay(setup, "--candidate", candidate, "--out", "run")
    outcomes = [json.loads(line) for line in (setup / "run" / "outcomes.jsonl").read_text().splitlines()]
    high = next(o for o in outcomes if o["request_id"] == "high")
    assert high["action"] == "pass" and high["threshold"] == 0.95
    assert len(outcomes) == 7


def test_a_rerun_continues_where_the_last_stopped(setup):
    candidate = _candidate(setup, "policy:\n  profiles:\n    general:\n      threshold: 0.5\n")
    _replay(setup, "--candidate", candidate, "--out", "run", "--limit", "3")
    assert len((setup / "run" / "outcomes.jsonl").read_text().splitlines()) == 3
    _replay(setup, "--candidate", candidate, "--out", "run")
    lines = (setup / "run" / "outcomes.jsonl").read_text().splitlines()
    assert len(lines) == 7 and len({json.loads(line)["row_id"] for line in lines}) == 7
    other = _candidate(setup, "policy:\n  profiles:\n    general:\n      threshold: 0.6\n")
    refused = morphguard("replay", "--config", "live.yaml", "--candidate", other, "--out", "run", cwd=setup)
    assert refused.returncode == 2 and "another candidate" in refused.stderr


def test_check_runs_the_candidate_detector_on_kept_texts_and_counts_the_rest(setup):
    candidate = _candidate(setup, "detector:\n  name: grounding\n")
    _replay(setup, "--candidate", candidate, "--depth", "check", "--out", "run")
    report = json.loads((setup / "run" / "report.json").read_text())
    assert report["status"] == {"decided": 3, "no_text": 3, "pending": 1}  # no context: nothing to check
    outcomes = {o["request_id"]: o for o in map(json.loads, (setup / "run" / "outcomes.jsonl").read_text()
                                                    .splitlines())}
    # the answer copied from the context scores low, the invented one high, under the candidate's own detector
    assert outcomes["border"]["score"] < 0.3 <= outcomes["high"]["score"]
    assert outcomes["border"]["action"] == "pass" and outcomes["high"]["action"] == "annotate"
    assert outcomes["missed"]["status"] == "no_text"


def test_filters_select_the_rows_replayed(setup):
    candidate = _candidate(setup, "policy:\n  profiles:\n    general:\n      threshold: 0.5\n")
    _replay(setup, "--candidate", candidate, "--out", "reviewed", "--reviewed")
    assert json.loads((setup / "reviewed" / "report.json").read_text())["rows"] == 3
    _replay(setup, "--candidate", candidate, "--out", "flagged", "--flagged")
    assert json.loads((setup / "flagged" / "report.json").read_text())["rows"] == 2


def test_a_candidate_with_other_topics_tags_kept_texts_again(setup):
    candidate = _candidate(setup, "policy:\n  topics:\n    culture:\n      keywords: [museum*]\n  profiles:\n"
                                  "    general:\n      topics:\n        culture:\n          threshold: 0.8\n")
    _replay(setup, "--candidate", candidate, "--out", "run")
    outcomes = {o["request_id"]: o for o in map(json.loads, (setup / "run" / "outcomes.jsonl").read_text()
                                                    .splitlines())}
    assert outcomes["high"]["candidate_topic"] == "culture" and outcomes["high"]["action"] == "annotate"
    assert outcomes["border"]["candidate_topic"] == "culture" and outcomes["border"]["action"] == "pass"
    assert outcomes["missed"]["candidate_topic"] == "general"  # no kept text: the stored topic
