"""The audit trail: one row per decision, and the escalation outbox.

SQLite beside the proxy by default, PostgreSQL for a fleet (`store.url`); the same tables on both
(`metadata`, kept current by the Alembic revisions in `migrations/`). Escalations are written here
before any delivery attempt and marked delivered once the webhook took them, so a crash between the two
only delays them (at-least-once). Question, answer and context are stored in full, as SHA-256 hashes, or
not at all (`policy.audit.store_text`).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import operator
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple, get_args

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from morphguard.config import AuditSettings, StoreSettings
from morphguard.models import utf8
from morphguard.policy.record import DecisionRecord, now
from morphguard.store import database

MIGRATIONS = str(Path(__file__).with_name("migrations"))
# What SQLite says when it cannot write for now (a lock, a full, read-only or failing disk): an outage, waited out.
SQLITE_OUTAGES = ("locked", "busy", "unable to open", "disk is full", "readonly database", "disk I/O error")
# PostgreSQL's read_only_sql_transaction: the server reached is a standby (before its promotion, or the old primary
# demoted) or was made read-only; it can take the row once writes go to a primary again.
POSTGRES_READ_ONLY = "25006"
RESTART_FRAMES = 4000  # pages of SQLite's write-ahead log (16 MB at 4 KB) past which a checkpoint may hold writers off


def _column_type(annotation: Any) -> sa.types.TypeEngine[Any]:
    kinds = {a for a in get_args(annotation) if a is not type(None)} or {annotation}
    if kinds == {bool}:
        return sa.Boolean()
    if kinds == {int}:
        return sa.Integer()
    if kinds == {float}:
        return sa.Float()
    if all(k is str or isinstance(k, str) for k in kinds):  # str, or the values of a Literal
        return sa.Text()
    return sa.JSON()


def _where(condition: str) -> dict[str, Any]:
    """A partial index's condition, for both backends."""
    return {"sqlite_where": sa.text(condition), "postgresql_where": sa.text(condition)}


# The schema, defined once for SQLite and PostgreSQL. The decisions table is DecisionRecord's fields in
# order; a field added there needs a migration (tests/store/test_schema.py says so).
metadata = sa.MetaData()
decisions = sa.Table(
    "decisions", metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    *(sa.Column(name, _column_type(field.annotation)) for name, field in DecisionRecord.model_fields.items()),
    sa.Index("decisions_time", "time"),
    sa.Index("decisions_request", "request_id", unique=True),  # one decision per request: writes are idempotent
    # Partial indexes: most rows have no score (nothing checked) and keep no text, and a row an index leaves out
    # costs its insert no index page. The review queue and the purge ask only for rows these hold.
    sa.Index("decisions_score", "score", "id", **_where("score IS NOT NULL")),  # the review queue, highest first
    sa.Index("decisions_text_kept", "text_kept_until", **_where("text_kept_until IS NOT NULL")),  # the purge
)
escalations = sa.Table(
    "escalations", metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("time", sa.Text, nullable=False),
    sa.Column("request_id", sa.Text, nullable=False),
    sa.Column("state", sa.Text, nullable=False),  # pending | delivered | undelivered
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
    sa.Column("error", sa.Text),
    sa.Column("payload", sa.Text, nullable=False),
    sa.Column("claimed_by", sa.Text),  # the process delivering it
    sa.Column("claimed_at", sa.Float),  # when that process last tried (epoch seconds)
    sa.Column("retry_at", sa.Float),  # undelivered: when to try again (epoch seconds); NULL: never again
    sa.Index("escalations_state", "state"),
)
reviews = sa.Table(
    "reviews", metadata,  # a person's judgement of a decision: its own record, never an edit of the decision
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("time", sa.Text, nullable=False),
    sa.Column("decision_id", sa.Integer, nullable=False),
    sa.Column("request_id", sa.Text, nullable=False),
    sa.Column("reviewer", sa.Text, nullable=False),
    sa.Column("label", sa.Text, nullable=False),  # hallucinated | faithful | unsure
    sa.Column("factoids", sa.JSON),  # factoid number → label, where the reviewer gave one
    sa.Column("note", sa.Text),
    sa.Index("reviews_decision", "decision_id"),
)
assignments = sa.Table(
    "assignments", metadata,  # which reviewer took a decision to review (policy.reviews)
    sa.Column("decision_id", sa.Integer, primary_key=True),
    sa.Column("reviewer", sa.Text, nullable=False),
    sa.Column("time", sa.Text, nullable=False),
    sa.Index("assignments_reviewer", "reviewer"),
)
revoked_sessions = sa.Table(
    "revoked_sessions", metadata,  # review console sessions ended by logging out (policy.reviews)
    sa.Column("session_id", sa.Text, primary_key=True),
    sa.Column("expires_at", sa.Float, nullable=False),  # the session's own end (epoch seconds): the row may go then
)
shadow_verdicts = sa.Table(
    "shadow_verdicts", metadata,  # what a shadow candidate made of a request (settle.shadow), beside its decision
    sa.Column("request_id", sa.Text, primary_key=True),
    sa.Column("time", sa.Text, nullable=False),
    sa.Column("candidate", sa.Text, nullable=False),
    sa.Column("changed", sa.Boolean, nullable=False),  # its action or flag differs from the live decision's
    sa.Column("action", sa.Text),
    sa.Column("outcome", sa.JSON, nullable=False),  # policy.comparison.Outcome
    sa.Index("shadow_verdicts_changed", "changed"),
)
COLUMNS = tuple(decisions.columns.keys())
_JSON_FIELDS = tuple(c.name for c in decisions.columns if isinstance(c.type, sa.JSON))
_TEXT_FIELDS = tuple(c.name for c in decisions.columns if isinstance(c.type, sa.Text))


class Written(NamedTuple):
    """What one decision's write left: its row id and its escalation's outbox id. Both None when the
    request id was recorded already (a check delivered twice): the first write stands, with its escalation."""

    row_id: int | None
    outbox_id: int | None


def process_identity() -> str:
    """Who holds a claim: host, pid and a random part (pids repeat across restarts and containers)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class AuditStore:
    def __init__(self, settings: AuditSettings, store: StoreSettings | None = None) -> None:
        store = store or StoreSettings()
        self.settings = settings
        self.url = database.url_for(store.url, settings.path)
        self.shared = not self.url.startswith("sqlite")  # other processes write here too
        self.engine = database.connect(self.url, store.pool_size, settings.synchronous)
        database.migrate(self.engine, MIGRATIONS)
        # One row per request is the hot path: the statements are compiled once and run as the driver's SQL.
        # ON CONFLICT DO NOTHING: a request id already recorded returns no row, and its write changes nothing.
        dialect = self.engine.dialect
        insert = postgresql.insert if dialect.name == "postgresql" else sqlite.insert
        self._insert = (insert(decisions).values({c: sa.bindparam(c) for c in DecisionRecord.model_fields})
                        .on_conflict_do_nothing(index_elements=["request_id"])
                        .returning(decisions.c.id).compile(dialect=dialect))
        self._sql = str(self._insert)
        # SQLite's driver takes the values in the statement's order, PostgreSQL's by name
        order = self._insert.positiontup
        self._in_order = operator.itemgetter(*order) if order else None
        outbox = ("time", "request_id", "state", "payload", "claimed_by", "claimed_at")
        self._outbox = (escalations.insert().values({c: sa.bindparam(c) for c in outbox})
                        .returning(escalations.c.id).compile(dialect=dialect))
        self._outbox_sql = str(self._outbox)
        # SQLite without a flush per commit (synchronous=normal): one connection of its own for `record_at_once`,
        # which never waits for the write lock (busy_timeout 0) and never checkpoints on commit. A commit that is
        # flushed to disk (full) waits for the disk: it never runs on the event loop.
        self._at_once: Any = None
        self._at_once_lock = threading.Lock()
        if not self.shared and settings.synchronous == "normal" \
                and sa.make_url(self.url).database not in (None, "", ":memory:"):
            pooled = self.engine.raw_connection()
            pooled.detach()  # out of the pool: held for the life of the store
            connection: Any = pooled.dbapi_connection
            connection.execute("PRAGMA busy_timeout=0")
            connection.execute("PRAGMA wal_autocheckpoint=0")
            self._at_once = connection

    def _text(self, value: str | None) -> str | None:
        if value is None or self.settings.store_text == "none":
            return None
        if self.settings.store_text == "hash":
            return "sha256:" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()
        return value

    def _keeps_text(self, record: DecisionRecord) -> bool:
        keep = self.settings.keep_text
        return self.settings.store_text != "full" and (
            keep == "flagged" and (record.flagged or record.escalated) or keep == "escalated" and record.escalated)

    def record(self, record: DecisionRecord, owner: str | None = None) -> int | None:
        """Write one decision (and its escalation); its row id, or None if its request id was recorded already."""
        return self.record_many([record], owner)[0].row_id

    def record_many(self, records: Sequence[DecisionRecord], owner: str | None = None) -> list[Written]:
        """Write decisions in one transaction (one commit for a burst), each escalated one with its outbox row,
        claimed by `owner`: a decision is never recorded without its escalation, nor the reverse. Waits for the
        database's write lock (up to its timeout) while another connection holds it."""
        connection = self.engine.raw_connection()
        try:
            return self._write(connection, records, owner)
        finally:
            connection.close()  # back to the pool, rolled back if it did not commit

    @property
    def writes_at_once(self) -> bool:
        """Whether `record_at_once` can write here (SQLite on a file, commits not flushed to disk one by one)."""
        return self._at_once is not None

    def record_at_once(self, records: Sequence[DecisionRecord], owner: str | None = None) -> list[Written] | None:
        """`record_many` on SQLite without ever waiting: None, nothing written, when another connection holds the
        write lock (or this one is in use from another thread) or the store is not SQLite. A commit writes the WAL
        and does not flush it to disk (synchronous=NORMAL) and runs no checkpoint (`checkpoint` does), so an event
        loop may call it: it costs the insert and nothing more. Raises what the database said of a refused row."""
        if not self._at_once_lock.acquire(blocking=False):
            return None
        connection = self._at_once
        try:
            if connection is None:  # not SQLite, or closed
                return None
            return self._write(connection, records, owner)
        except BaseException as exc:
            connection.rollback()
            if self.unavailable(exc):  # locked by another connection: the caller writes them where it may wait
                return None
            raise
        finally:
            self._at_once_lock.release()

    def checkpoint(self) -> None:
        """SQLite: copy the write-ahead log back into the database, so that it is written from its start again.
        `record_at_once` writes nothing meanwhile (its rows go to a thread and wait): commits that kept overtaking
        the checkpoint would keep the log from ever restarting. PASSIVE waits for nobody; where other processes'
        commits kept it from finishing and the log has grown past `RESTART_FRAMES`, RESTART holds their commits
        off for up to a second (they wait in their writers' threads) until the log is copied."""
        with self._at_once_lock:
            connection = self._at_once
            if connection is None:
                return
            _, frames, copied = connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            if frames > RESTART_FRAMES and copied < frames:
                connection.execute("PRAGMA busy_timeout=1000")
                try:
                    connection.execute("PRAGMA wal_checkpoint(RESTART)").fetchall()
                finally:
                    connection.execute("PRAGMA busy_timeout=0")

    def _write(self, connection: Any, records: Sequence[DecisionRecord], owner: str | None) -> list[Written]:
        rows = [self._args(r) for r in records]
        # The driver's own connection and cursor (its statement cache keeps the two statements prepared):
        # SQLAlchemy's execution layer cost ten times the insert.
        cursor = connection.cursor()
        written = []
        for record, args in zip(records, rows, strict=True):
            cursor.execute(self._sql, args)
            returned = cursor.fetchone()
            if returned is None:  # recorded already
                written.append(Written(None, None))
                continue
            outbox_id = None
            if record.escalated:
                cursor.execute(self._outbox_sql, self._outbox_args(record, owner))
                (outbox_id,) = cursor.fetchone() or (None,)
            written.append(Written(int(returned[0]), outbox_id and int(outbox_id)))
        cursor.close()
        connection.commit()
        return written

    def _outbox_args(self, record: DecisionRecord, owner: str | None) -> Any:
        row = {"time": now(), "request_id": _sql(record.request_id), "state": "pending",
               "payload": _json_text(record.escalation()), "claimed_by": owner, "claimed_at": time.time()}
        order = self._outbox.positiontup
        return tuple(row[name] for name in order) if order else row

    def recorded(self, request_ids: Sequence[str]) -> set[str]:
        """Of these request ids, those whose decision is recorded."""
        c = decisions.c
        found: set[str] = set()
        with self.engine.connect() as db:
            for start in range(0, len(request_ids), 500):
                chunk = [_sql(r) for r in request_ids[start:start + 500]]
                found.update(db.execute(sa.select(c.request_id).where(c.request_id.in_(chunk))).scalars())
        return found

    def unavailable(self, exc: BaseException) -> bool:
        """Whether `exc` says the database cannot be reached, is busy or cannot write now (worth waiting for), not
        that it refused the row."""
        dbapi = self.engine.dialect.dbapi
        kinds: tuple[type[BaseException], ...] = (sa.exc.OperationalError, sa.exc.InterfaceError,
                                                  sa.exc.TimeoutError, sa.exc.DisconnectionError)
        if dbapi is not None:
            kinds += (dbapi.OperationalError, dbapi.InterfaceError)
        if self.url.startswith("sqlite"):  # SQLite says OperationalError for a missing table too: that is broken
            return isinstance(exc, kinds) and any(w in str(exc) for w in SQLITE_OUTAGES)
        return isinstance(exc, kinds) or getattr(getattr(exc, "orig", exc), "sqlstate", None) == POSTGRES_READ_ONLY

    def _args(self, record: DecisionRecord) -> Any:
        row = record.model_dump()
        if self._keeps_text(record):
            until = datetime.now(UTC) + timedelta(days=self.settings.keep_text_days)
            row["text_kept_until"] = until.isoformat(timespec="milliseconds")
        else:
            for name in DecisionRecord.TEXTS:
                row[name] = self._text(row[name])
        # Without SQLAlchemy's type processing here: JSON columns go in as the JSON text sa.JSON would write, text
        # as both engines take it, numbers and booleans as they are.
        for name in _JSON_FIELDS:
            if row[name] is not None:
                row[name] = _json_text(row[name])
        for name in _TEXT_FIELDS:
            if row[name] is not None:
                row[name] = _sql(row[name])
        return self._in_order(row) if self._in_order is not None else row

    def reachable(self) -> bool:
        return database.reachable(self.engine)

    def purge_text(self) -> int:
        """Reduce texts kept for review past their time to what `store_text` says; returns how many rows."""
        c = decisions.c
        moment = now()
        with self.engine.begin() as db:
            rows = db.execute(sa.select(c.id, c.question, c.answer, c.context)
                              .where(c.text_kept_until.is_not(None), c.text_kept_until < moment)
                              .with_for_update(skip_locked=True)).all()
            for row_id, question, answer, context in rows:
                db.execute(decisions.update().where(c.id == row_id).values(
                    question=self._text(question), answer=self._text(answer), context=self._text(context),
                    text_kept_until=None))
        return len(rows)

    # A shadow candidate's verdicts (settle.shadow), beside the decisions they shadow.

    def record_shadow(self, request_id: str, candidate: str, changed: bool, action: str | None,
                      outcome: dict[str, Any], texts: dict[str, str | None] | None = None) -> None:
        """Store what the candidate made of a request (a second verdict for it changes nothing). `texts`: question,
        answer and context to keep for review, as a flagged answer's are (`keep_text`), where the candidate and the
        live decision disagree and the row keeps none yet: reviewers label exactly those."""
        insert = postgresql.insert if self.engine.dialect.name == "postgresql" else sqlite.insert
        c = decisions.c
        with self.engine.begin() as db:
            db.execute(insert(shadow_verdicts).values(
                request_id=request_id, time=now(), candidate=candidate, changed=changed, action=action,
                outcome=json.loads(_json_text(outcome))).on_conflict_do_nothing(index_elements=["request_id"]))
            if texts and self.settings.keep_text != "none" and self.settings.store_text != "full":
                until = datetime.now(UTC) + timedelta(days=self.settings.keep_text_days)
                db.execute(decisions.update().where(c.request_id == request_id, c.text_kept_until.is_(None))
                           .values(**{k: _sql(v) for k, v in texts.items()},
                                   text_kept_until=until.isoformat(timespec="milliseconds")))

    def shadow_outcomes(self, since: str | None = None, until: str | None = None,
                        candidate: str | None = None) -> list[dict[str, Any]]:
        """The stored shadow verdicts (`policy.comparison.Outcome` as dicts), oldest first, each with the current
        review label of its decision."""
        v = shadow_verdicts.c
        label = (sa.select(reviews.c.label).join(decisions, decisions.c.id == reviews.c.decision_id)
                 .where(decisions.c.request_id == v.request_id).order_by(reviews.c.id.desc()).limit(1)
                 .scalar_subquery())
        sql = sa.select(v.outcome, label.label("review")).order_by(v.time, v.request_id)
        if since:
            sql = sql.where(v.time >= since)
        if until:
            sql = sql.where(v.time < until)
        if candidate:
            sql = sql.where(v.candidate == candidate)
        with self.engine.connect() as db:
            return [{**outcome, "label": review} for outcome, review in db.execute(sql)]

    # The escalation outbox. The replica that writes an escalation holds its claim and delivers it; a claim
    # not renewed (`renew_claim`) for `stale_s` is taken by whoever sweeps next (`claim_escalations`).

    def add_escalation(self, request_id: str, payload: dict[str, Any], owner: str) -> int:
        with self.engine.begin() as db:
            return int(db.execute(escalations.insert().values(
                time=now(), request_id=_sql(request_id), state="pending", payload=json.dumps(payload),
                claimed_by=owner, claimed_at=time.time()).returning(escalations.c.id)).scalar_one())

    def claim_escalations(self, owner: str, stale_s: float, limit: int = 100) -> list[tuple[int, dict[str, Any]]]:
        """Escalations nobody delivers, now claimed by `owner`: pending ones whose claim is older than `stale_s`,
        and undelivered ones whose `retry_at` has come.

        SKIP LOCKED: replicas sweeping at the same moment take disjoint sets (on SQLite the write lock
        serialises them instead).
        """
        e = escalations.c
        moment = time.time()
        abandoned = sa.and_(e.state == "pending", sa.or_(e.claimed_at.is_(None), e.claimed_at < moment - stale_s))
        due = sa.and_(e.state == "undelivered", e.retry_at <= moment)
        free = (sa.select(e.id).where(sa.or_(abandoned, due))
                .order_by(e.id).limit(limit).with_for_update(skip_locked=True))
        with self.engine.begin() as db:
            rows = db.execute(escalations.update().where(e.id.in_(free.scalar_subquery()))
                              .values(state="pending", claimed_by=owner, claimed_at=moment, retry_at=None)
                              .returning(e.id, e.payload)).all()
        return sorted((i, json.loads(p)) for i, p in rows)

    def renew_claim(self, escalation_id: int, owner: str) -> bool:
        """Renew before an attempt; False: another process took the escalation over, leave it to them."""
        with self.engine.begin() as db:
            result = db.execute(escalations.update().where(escalations.c.id == escalation_id,
                                                           escalations.c.claimed_by == owner,
                                                           escalations.c.state == "pending")
                                .values(claimed_at=time.time()))
        return bool(result.rowcount)

    def escalation_outcome(self, escalation_id: int, delivered: bool, attempts: int, error: str | None = None,
                           retry_at: float | None = None) -> None:
        """Delivered, or undelivered to be tried again at `retry_at` (None: never again)."""
        with self.engine.begin() as db:
            db.execute(escalations.update().where(escalations.c.id == escalation_id).values(
                state="delivered" if delivered else "undelivered", attempts=escalations.c.attempts + attempts,
                error=error, retry_at=None if delivered else retry_at))

    def escalation_states(self) -> dict[str, int]:
        with self.engine.connect() as db:
            rows = db.execute(sa.select(escalations.c.state, sa.func.count()).group_by(escalations.c.state)).all()
        return {state: int(count) for state, count in rows}

    def escalation_backlog(self) -> int:
        """Escalations not delivered yet that still will be tried: pending, or undelivered with a retry ahead."""
        e = escalations.c
        waiting = sa.or_(e.state == "pending", sa.and_(e.state == "undelivered", e.retry_at.is_not(None)))
        with self.engine.connect() as db:
            return int(db.execute(sa.select(sa.func.count()).where(waiting)).scalar_one())

    def redeliver_escalations(self) -> int:
        """Every undelivered escalation due now, those given up on included: the running proxies' and workers'
        sweeps take them (`morphguard audit --redeliver`, once the webhook is back)."""
        e = escalations.c
        with self.engine.begin() as db:
            done = db.execute(sa.update(escalations).where(e.state == "undelivered").values(retry_at=time.time()))
        return int(done.rowcount or 0)

    def undelivered_escalations(self) -> list[dict[str, Any]]:
        e = escalations.c
        with self.engine.connect() as db:
            rows = db.execute(sa.select(e.time, e.request_id, e.attempts, e.error, e.payload)
                              .where(e.state == "undelivered").order_by(e.id)).all()
        return [{"time": t, "request_id": r, "attempts": a, "error": err, "payload": json.loads(p)}
                for t, r, a, err, p in rows]

    def query(self, *, flagged: bool | None = None, topic: str | None = None, since: str | None = None,
              until: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        c = decisions.c
        sql = sa.select(decisions).order_by(c.id)
        if flagged is not None:
            sql = sql.where(c.flagged == flagged)
        if topic:
            sql = sql.where(c.topic == topic)
        if since:
            sql = sql.where(c.time >= since)
        if until:
            sql = sql.where(c.time < until)
        if limit:
            sql = sql.limit(int(limit))
        with self.engine.connect() as db:
            rows = db.execute(sql).mappings().all()
        return [_row(dict(r)) for r in rows]

    def close(self) -> None:
        with self._at_once_lock:
            if self._at_once is not None:
                self._at_once.close()
                self._at_once = None
        self.engine.dispose()


def _sql(value: Any) -> Any:
    """Text as both engines take it: valid UTF-8 and no NUL (PostgreSQL refuses it in text)."""
    if isinstance(value, str):
        return utf8(value).replace("\x00", "\ufffd")
    return value


def _json_text(value: Any) -> str:
    """A JSON column's text, serialised once, without the NUL escape PostgreSQL refuses."""
    return json.dumps(value).replace("\\u0000", "\\ufffd")


def _row(raw: dict[str, Any]) -> dict[str, Any]:
    raw["factoids"] = raw["factoids"] or []
    return raw


def to_jsonl(rows: Sequence[dict[str, Any]]) -> Iterator[str]:
    for row in rows:
        yield json.dumps(row, ensure_ascii=False) + "\n"


def to_csv(rows: Sequence[dict[str, Any]]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS)
    writer.writeheader()
    for row in rows:
        writer.writerow({k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in row.items()})
    return out.getvalue()


def parse_time(text: str) -> str:
    """An ISO date or time, or a relative age like 30m, 24h, 7d, as the UTC ISO string the table stores."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if text and text[-1] in units and text[:-1].isdigit():
        moment = time.time() - int(text[:-1]) * units[text[-1]]
        return datetime.fromtimestamp(moment, UTC).isoformat(timespec="milliseconds")
    parsed = datetime.fromisoformat(text)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC).isoformat(timespec="milliseconds")
