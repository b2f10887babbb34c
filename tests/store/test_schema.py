"""One schema for both backends, kept by migrations: what the Alembic revisions build is exactly
`policy.audit.metadata`, on SQLite and on PostgreSQL; a store made before migrations existed joins the
history without losing a row; the outbox hands each escalation to one claimant at a time."""

from __future__ import annotations

import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from morphguard.config import AuditSettings, StoreSettings
from morphguard.policy.audit import AuditStore, metadata
from morphguard.policy.record import DecisionRecord
from tests.servers import free_port


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, tmp_path):
    url = None if request.param == "sqlite" else request.getfixturevalue("postgres_url")
    audit = AuditStore(AuditSettings(path=str(tmp_path / "audit.db"), store_text="full"), StoreSettings(url=url))
    yield audit
    audit.close()


def test_migrations_build_exactly_the_declared_schema(store):
    with store.engine.connect() as connection:
        differences = compare_metadata(MigrationContext.configure(connection), metadata)
    assert differences == []  # a field added to DecisionRecord without a migration shows up here


def test_rows_round_trip_with_hostile_text(store):
    record = DecisionRecord(request_id="r1", profile="general", topic="healthcare", checked=True, score=0.7,
                            flagged=True, question="nul \x00 and half \ud800 <script>", answer="a",
                            cost={"calls": 2}, factoids=[{"text": "t", "score": 0.7, "flagged": True}])
    store.record(record)
    (row,) = store.query(flagged=True)
    question = row["question"]  # stored as valid UTF-8 without NUL, which PostgreSQL refuses in text
    assert question.startswith("nul \ufffd and half \ufffd") and question.endswith(" <script>")
    assert "\x00" not in question and "\ud800" not in question
    assert row["checked"] is True and row["cost"] == {"calls": 2} and row["factoids"][0]["text"] == "t"
    assert store.query(topic="general") == []


def test_each_escalation_is_claimed_by_one_process(store):
    for i in range(40):
        store.add_escalation(f"r{i}", {"request_id": f"r{i}"}, owner="dead-replica")
    time.sleep(1.1)  # the writer died; once its claims are stale, four replicas sweep at once
    with ThreadPoolExecutor(4) as pool:
        taken = list(pool.map(lambda n: store.claim_escalations(f"replica-{n}", stale_s=1.0, limit=40), range(4)))
    ids = [i for batch in taken for i, _ in batch]
    assert sorted(ids) == sorted(set(ids)) and len(ids) == 40
    # a claim renewed by its holder is not stale for the others
    holder = next(n for n, batch in enumerate(taken) if batch)
    first = taken[holder][0][0]
    assert store.renew_claim(first, f"replica-{holder}")
    assert first not in [i for i, _ in store.claim_escalations("late", stale_s=60.0)]
    assert not store.renew_claim(first, "late")
    store.escalation_outcome(first, delivered=True, attempts=1)
    assert store.escalation_states() == {"delivered": 1, "pending": 39}


def test_a_store_from_before_migrations_is_upgraded_in_place(tmp_path):
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:  # the tables as an early version wrote them, two columns short
        db.executescript("""
            CREATE TABLE decisions (id INTEGER PRIMARY KEY, time TEXT, request_id TEXT, profile TEXT, topic TEXT,
                                    checked INTEGER, flagged INTEGER, action TEXT, escalated INTEGER);
            INSERT INTO decisions (time, request_id, profile, topic, checked, flagged, action, escalated)
                VALUES ('2026-01-01T00:00:00.000+00:00', 'old', 'general', 'general', 1, 1, 'annotate', 0);
            CREATE TABLE escalations (id INTEGER PRIMARY KEY, time TEXT NOT NULL, request_id TEXT NOT NULL,
                                      state TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, error TEXT,
                                      payload TEXT NOT NULL);
            INSERT INTO escalations (time, request_id, state, payload) VALUES ('t', 'old', 'pending', '{}');
        """)
    store = AuditStore(AuditSettings(path=str(path)))
    try:
        (row,) = store.query()
        assert row["request_id"] == "old" and row["flagged"] is True and row["regenerations"] is None
        assert [i for i, _ in store.claim_escalations("me", stale_s=60.0)] == [1]  # never claimed: free
        store.record(DecisionRecord(request_id="new", profile="general", topic="general"))
        assert [r["request_id"] for r in store.query()] == ["old", "new"]
    finally:
        store.close()


def test_a_request_recorded_twice_keeps_its_first_row_and_one_escalation(store):
    first = DecisionRecord(request_id="twice", profile="general", topic="general", checked=True, score=0.9,
                           flagged=True, escalated=True)
    (written,) = store.record_many([first], owner="worker-a")
    assert written.row_id is not None and written.outbox_id is not None
    again = store.record_many([first.model_copy(update={"score": 0.1}), first], owner="worker-b")
    assert again == [(None, None), (None, None)]  # a second delivery of the check changes nothing
    (row,) = store.query()
    assert row["score"] == 0.9
    assert store.escalation_states() == {"pending": 1}
    assert store.recorded(["twice", "never"]) == {"twice"}


def test_an_undelivered_escalation_is_claimed_again_once_its_retry_is_due(store):
    (written,) = store.record_many([DecisionRecord(request_id="e", profile="general", topic="general",
                                                   escalated=True)], owner="me")
    assert written.outbox_id is not None
    store.escalation_outcome(written.outbox_id, delivered=False, attempts=4, error="503", retry_at=time.time() + 60)
    assert store.claim_escalations("sweeper", stale_s=0.0) == []  # not yet due
    store.escalation_outcome(written.outbox_id, delivered=False, attempts=4, error="503", retry_at=time.time() - 1)
    assert store.escalation_backlog() == 1
    (claimed,) = store.claim_escalations("sweeper", stale_s=60.0)
    assert claimed[0] == written.outbox_id and store.escalation_states() == {"pending": 1}
    store.escalation_outcome(written.outbox_id, delivered=False, attempts=4, error="503", retry_at=None)
    assert store.claim_escalations("sweeper", stale_s=0.0) == [] and store.escalation_backlog() == 0  # given up


def test_duplicates_already_in_a_store_are_kept_apart_by_the_migration(tmp_path):
    path = tmp_path / "dups.db"
    store = AuditStore(AuditSettings(path=str(path)))
    store.close()
    with sqlite3.connect(path) as db:  # a store at revision 0004, where a check recorded twice left two rows
        db.executescript("""
            DROP INDEX decisions_request;
            CREATE INDEX decisions_request ON decisions (request_id);
            ALTER TABLE escalations DROP COLUMN retry_at;
            DROP TABLE assignments;
            DROP TABLE shadow_verdicts;
            ALTER TABLE decisions DROP COLUMN released_chars;
            ALTER TABLE decisions DROP COLUMN released_score;
            ALTER TABLE decisions DROP COLUMN released_flagged;
            ALTER TABLE decisions DROP COLUMN gateway;
            ALTER TABLE decisions DROP COLUMN explanation;
            ALTER TABLE decisions DROP COLUMN unchecked;
            UPDATE alembic_version SET version_num = '0004';
            INSERT INTO decisions (request_id, profile, topic) VALUES ('a', 'general', 'general');
            INSERT INTO decisions (request_id, profile, topic) VALUES ('a', 'general', 'general');
            INSERT INTO decisions (request_id, profile, topic) VALUES ('b', 'general', 'general');
        """)
    store = AuditStore(AuditSettings(path=str(path)))
    try:
        assert [r["request_id"] for r in store.query()] == ["a", "a#dup2", "b"]
        assert store.record(DecisionRecord(request_id="a", profile="general", topic="general")) is None
    finally:
        store.close()


def test_unchecked_rows_stay_out_of_the_review_and_purge_indexes(store):
    """Most rows are unchecked and keep no text: the indexes that read only scored rows and rows keeping their
    text leave them out, so writing one updates neither index."""
    catalog = ("SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'decisions'"
               if store.url.startswith("sqlite") else
               "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'decisions'")
    with store.engine.connect() as connection:
        definition = dict(connection.execute(sa.text(catalog)).all())
    assert "WHERE" in definition["decisions_score"] and "score IS NOT NULL" in definition["decisions_score"]
    assert "text_kept_until IS NOT NULL" in definition["decisions_text_kept"]
    assert "WHERE" not in definition["decisions_request"]  # every row's request id is unique
    assert set(definition) >= {"decisions_time", "decisions_request", "decisions_score", "decisions_text_kept"}


def test_a_store_on_several_hosts_written_as_libpq_lists_them(postgres_url, tmp_path):
    """`user@host1:port1,host2:port2/db`: the first host refuses connections, the store writes to the second."""
    several = postgres_url.replace("@", f"@127.0.0.1:{free_port()},", 1) + "?connect_timeout=2"
    audit = AuditStore(AuditSettings(path=str(tmp_path / "audit.db")), StoreSettings(url=several))
    try:
        audit.record(DecisionRecord(request_id="r1", profile="general", topic="general", checked=False))
        assert [row["request_id"] for row in audit.query()] == ["r1"]
    finally:
        audit.close()
