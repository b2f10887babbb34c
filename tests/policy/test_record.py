"""One decision record: the client's object, the headers, the audit row and the webhook body agree."""

from __future__ import annotations

import sqlite3

from morphguard.config import AuditSettings
from morphguard.models import Decision, Detection, Factoid
from morphguard.policy.audit import COLUMNS, AuditStore
from morphguard.policy.record import DecisionRecord, Released

DECISION = Decision(profile="general", topic="pregnancy", threshold=0.3, flagged=True, action="annotate",
                    escalate=True)
DETECTION = Detection(detector="metarag", score=0.75, threshold=0.5, flagged=True,
                      factoids=[Factoid(text="safe", start=0, end=4, score=0.75), Factoid(text="ok", score=0.1)])


def checked() -> DecisionRecord:
    return DecisionRecord.of_check(request_id="r1", decision=DECISION, detection=DETECTION, latency_ms=12.4,
                                   context_source="explicit", question="q?", answer="a.", context="c.")


def test_the_client_object_carries_the_decision_and_never_the_texts():
    payload = checked().payload()
    assert payload["checked"] and payload["score"] == 0.75 and payload["latency_ms"] == 12
    assert [f["flagged"] for f in payload["factoids"]] == [True, False]
    assert not {"question", "answer", "context", "cost", "time", "model", "route"} & payload.keys()
    assert "regenerations" not in payload


def test_a_queued_record_says_so_without_a_score():
    pending = DecisionRecord(request_id="r2", profile="general", topic="general", reason="queued")
    assert pending.payload() == {"request_id": "r2", "profile": "general", "topic": "general", "checked": False,
                                 "flagged": False, "action": "pass", "escalated": False, "reason": "queued"}
    assert pending.headers() == {"x-morphguard-action": "pass", "x-morphguard-checked": "false",
                                 "x-morphguard-request-id": "r2"}


def test_an_unchecked_pass_is_marked_on_the_verdict_the_headers_the_row_and_the_webhook_body(tmp_path):
    decision = Decision(profile="general", topic="general", threshold=0.3, flagged=False, action="pass",
                        escalate=True, reason="fail_open: judge_error", unchecked=True)
    record = DecisionRecord.of_check(request_id="r3", decision=decision, detection=None, latency_ms=0)
    assert record.payload()["unchecked"] is True and record.payload()["checked"] is False
    assert record.headers()["x-morphguard-unchecked"] == "true"
    assert record.escalation()["unchecked"] is True
    store = AuditStore(AuditSettings(path=str(tmp_path / "audit.db")))
    try:
        store.record(record)
        assert store.query()[0]["unchecked"] in (True, 1)
    finally:
        store.close()
    assert "unchecked" not in checked().payload() and "x-morphguard-unchecked" not in checked().headers()


def test_headers_and_webhook_body_come_from_the_same_record():
    record = checked()
    assert record.headers()["x-morphguard-score"] == "0.7500" and record.headers()["x-morphguard-flagged"] == "true"
    body = record.escalation()
    assert body["request_id"] == "r1" and body["score"] == 0.75 and not {"question", "answer", "context"} & body.keys()


def test_an_audit_store_of_an_older_version_gains_the_new_columns(tmp_path):
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:  # the decisions table as version 0.1 made it
        db.execute("CREATE TABLE decisions (id INTEGER PRIMARY KEY, time TEXT NOT NULL, request_id TEXT NOT NULL, "
                   "trace_id TEXT, profile TEXT NOT NULL, route TEXT, model TEXT, topic TEXT NOT NULL, "
                   "checked INTEGER NOT NULL, score REAL, threshold REAL NOT NULL, flagged INTEGER NOT NULL, "
                   "action TEXT NOT NULL, escalated INTEGER NOT NULL, reason TEXT, detector TEXT, "
                   "factoids TEXT NOT NULL, cost TEXT, question TEXT, answer TEXT, context TEXT)")
        db.execute("INSERT INTO decisions (time, request_id, profile, topic, checked, threshold, flagged, action, "
                   "escalated, factoids) VALUES ('2026-01-01', 'old', 'general', 'general', 0, 0.5, 0, 'pass', 0, "
                   "'[]')")
    store = AuditStore(AuditSettings(path=str(path), store_text="full"))
    store.record(checked())
    rows = store.query()
    store.close()
    assert [r["request_id"] for r in rows] == ["old", "r1"]
    assert rows[0]["context_source"] is None and rows[1]["context_source"] == "explicit"
    assert rows[1]["factoids"][0]["text"] == "safe" and rows[1]["answer"] == "a." and set(rows[1]) == set(COLUMNS)


def test_a_claim_named_by_several_parts_of_a_check_is_one_entry_with_its_worst_score():
    from morphguard.config import PolicySettings
    from morphguard.models import Evidence
    from morphguard.policy.actions import apply

    answer = "Ibuprofen is safe throughout pregnancy. It helps."
    source = Evidence(passage=1, start=0, end=52, text="Ibuprofen is contraindicated in the third trimester.")
    # the judge, the grounding score and the spot check each name the first sentence (as `combined` does)
    detection = Detection(detector="combined", score=0.9, threshold=0.5, flagged=True, factoids=[
        Factoid(text=answer[:39], start=0, end=39, score=0.9),
        Factoid(text=answer[:39], start=0, end=39, score=0.4, evidence=[source]),
        Factoid(text=answer[40:], start=40, end=49, score=0.2),
        Factoid(text=answer[:39], start=0, end=39, score=0.6),
        Factoid(text="unplaced claim", score=0.1), Factoid(text="unplaced claim", score=0.7)])
    decision = DECISION.model_copy(update={"action": "cite"})
    payload = DecisionRecord.of_check(request_id="r3", decision=decision, detection=detection,
                                      latency_ms=1).payload()
    assert [(f.get("start"), f["score"], f["flagged"]) for f in payload["factoids"]] == [
        (0, 0.9, True), (40, 0.2, False), (None, 0.7, True)]
    completion = {"choices": [{"index": 0, "message": {"role": "assistant", "content": answer}}]}
    cited = apply(completion, decision, detection, ["Ibuprofen is contraindicated in the third trimester."],
                  PolicySettings())["choices"][0]["message"]["content"]
    assert cited.count(answer[:39]) == 2  # the answer itself, and one citation of it
    assert 'source [1] says "Ibuprofen is contraindicated in the third trimester."' in cited


def test_parts_naming_one_sentence_with_and_without_its_full_stop_are_one_claim() -> None:
    from morphguard.models import Factoid
    from morphguard.policy.actions import claims

    answer_sentence = Factoid(text="Yes, ibuprofen is safe throughout pregnancy.", start=0, end=44, score=0.9,
                              reason="unsupported: safe, throughout")
    without_stop = Factoid(text="Yes, ibuprofen is safe throughout pregnancy", start=0, end=43, score=0.95,
                           reason="the judge: the context says the opposite")
    phrase = Factoid(text="safe throughout pregnancy", start=18, end=43, score=0.8)
    merged = claims([answer_sentence, without_stop, phrase])
    assert len(merged) == 2
    assert merged[0].score == 0.95
    assert merged[0].reason == "unsupported: safe, throughout; the judge: the context says the opposite"
    assert merged[1].text == "safe throughout pregnancy"


def test_a_stream_checked_as_it_flows_records_what_it_released_apart_from_the_verdict_on_the_rest():
    blocked = DECISION.model_copy(update={"action": "block"})
    record = DecisionRecord.of_check(request_id="r3", decision=blocked, detection=DETECTION, latency_ms=3,
                                     **Released(chars=48, score=0.2212, flagged=False).fields())
    payload = record.payload()
    assert (payload["action"], payload["released_chars"], payload["released_score"],
            payload["released_flagged"]) == ("block", 48, 0.2212, False)
    assert not {"released_chars", "released_score", "released_flagged"} & checked().payload().keys()
