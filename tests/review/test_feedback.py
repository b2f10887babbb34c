"""Judgements feed back: `morphguard eval --dataset reviews` reads what reviewers labelled (with the text
the audit kept) as a labelled dataset, and proposes thresholds per topic from it."""

from __future__ import annotations

import yaml

from morphguard.cli import main
from morphguard.config import AuditSettings, load_config
from morphguard.eval import datasets
from morphguard.policy.audit import AuditStore
from morphguard.policy.record import DecisionRecord
from morphguard.policy.reviews import ReviewStore

PASSAGE = "Ibuprofen is contraindicated in the third trimester of pregnancy."


def test_reviewed_decisions_are_a_dataset_that_proposes_thresholds(tmp_path, capsys, monkeypatch):
    path = tmp_path / "audit.db"
    store = AuditStore(AuditSettings(path=str(path)))
    reviews = ReviewStore(store)
    for i in range(12):
        wrong = i % 2 == 0  # long invented answers are the hallucinated ones
        answer = (f"Ibuprofen is safe in pregnancy and cures {i} other conditions within days, doctors say."
                  if wrong else "Ibuprofen is contraindicated in the third trimester.")
        row = store.record(DecisionRecord(request_id=f"r{i}", profile="general", topic="pregnancy", checked=True,
                                          flagged=True, score=0.5, question="Can I take ibuprofen?", answer=answer,
                                          context=PASSAGE))
        reviews.judge(row, "alice", "hallucinated" if wrong else "faithful")
    unsure = store.record(DecisionRecord(request_id="u", profile="general", topic="pregnancy", checked=True,
                                         flagged=True, score=0.5, question="q", answer="a", context=PASSAGE))
    reviews.judge(unsure, "alice", "unsure")
    hashed = store.record(DecisionRecord(request_id="h", profile="general", topic="pregnancy", checked=True,
                                         flagged=False, score=0.1, question="q", answer="a", context=PASSAGE))
    reviews.judge(hashed, "alice", "faithful")  # its text was not kept (not flagged): left out
    store.close()
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump({"policy": {"audit": {"path": str(path)}}}))

    items = datasets.load("reviews", config=load_config(config_path))
    assert len(items) == 12 and sum(i.hallucinated for i in items) == 6
    assert {i.topic for i in items} == {"pregnancy"} and items[0].passages == [PASSAGE]

    monkeypatch.chdir(tmp_path)
    code = main(["eval", "--dataset", "reviews", "--detector", "length", "--target-recall", "0.8",
                 "--config", str(config_path)])
    out = capsys.readouterr().out
    assert code == 0
    assert "pregnancy: {threshold:" in out  # a per-topic proposal from the reviewers' labels
