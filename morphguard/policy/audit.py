"""The audit trail: one SQLite row per decision, and the escalation outbox.

Escalations are written here before any delivery attempt and marked delivered once the webhook took
them, so a crash between the two only delays them to the next start (at-least-once).

SQLite in WAL mode: readers (`morphguard audit`) never block the proxy's writes. Question, answer and
context are stored in full, as SHA-256 hashes, or not at all (`policy.audit.store_text`).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, get_args

from morphguard.config import AuditSettings
from morphguard.models import utf8
from morphguard.policy.record import DecisionRecord, now

_SCHEMA = """
CREATE TABLE IF NOT EXISTS escalations (
    id INTEGER PRIMARY KEY,
    time TEXT NOT NULL,
    request_id TEXT NOT NULL,
    state TEXT NOT NULL,  -- pending | delivered | undelivered
    attempts INTEGER NOT NULL DEFAULT 0,
    error TEXT,
    payload TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS escalations_state ON escalations (state);
"""

# The decisions table is DecisionRecord's fields, in order; a store made by an older version gets the
# columns it lacks added on open (its rows read NULL there).
COLUMNS = ("id", *DecisionRecord.model_fields)
_JSON = ("factoids", "cost")
_BOOLS = ("checked", "flagged", "escalated")


def _sql_type(annotation: Any) -> str:
    kinds = {a for a in get_args(annotation) if a is not type(None)} or {annotation}
    if kinds <= {bool, int}:
        return "INTEGER"
    return "REAL" if kinds == {float} else "TEXT"


def _decisions_schema() -> str:
    columns = ",\n    ".join(f"{name} {_sql_type(field.annotation)}"
                              for name, field in DecisionRecord.model_fields.items())
    return (f"CREATE TABLE IF NOT EXISTS decisions (\n    id INTEGER PRIMARY KEY,\n    {columns}\n);\n"
            "CREATE INDEX IF NOT EXISTS decisions_time ON decisions (time);\n"
            "CREATE INDEX IF NOT EXISTS decisions_request ON decisions (request_id);\n")


class AuditStore:
    def __init__(self, settings: AuditSettings) -> None:
        self.settings = settings
        self.path = Path(settings.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()  # one connection shared by the proxy's worker threads
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=10)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_decisions_schema() + _SCHEMA)
        present = {row[1] for row in self._db.execute("PRAGMA table_info(decisions)")}
        for name, field in DecisionRecord.model_fields.items():
            if name not in present:
                self._db.execute(f"ALTER TABLE decisions ADD COLUMN {name} {_sql_type(field.annotation)}")

    def _text(self, value: str | None) -> str | None:
        if value is None or self.settings.store_text == "none":
            return None
        if self.settings.store_text == "hash":
            return "sha256:" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()
        return value

    def record(self, record: DecisionRecord) -> int:
        """Write one decision; text fields are stored as configured. Returns the row id."""
        row = record.model_dump()
        for name in DecisionRecord.TEXTS:
            row[name] = self._text(row[name])
        for name in _JSON:
            row[name] = json.dumps(row[name]) if row[name] is not None else None
        names = list(DecisionRecord.model_fields)
        with self._lock:
            cursor = self._db.execute(
                f"INSERT INTO decisions ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
                [_sql(row[c]) for c in names])
        return int(cursor.lastrowid or 0)

    def add_escalation(self, request_id: str, payload: dict[str, Any]) -> int:
        with self._lock:
            cursor = self._db.execute("INSERT INTO escalations (time, request_id, state, payload) "
                                      "VALUES (?, ?, 'pending', ?)", (now(), _sql(request_id), json.dumps(payload)))
        return int(cursor.lastrowid or 0)

    def pending_escalations(self) -> list[tuple[int, dict[str, Any]]]:
        with self._lock:
            rows = self._db.execute("SELECT id, payload FROM escalations WHERE state = 'pending' ORDER BY id"
                                    ).fetchall()
        return [(i, json.loads(p)) for i, p in rows]

    def escalation_outcome(self, escalation_id: int, delivered: bool, attempts: int, error: str | None = None
                           ) -> None:
        with self._lock:
            self._db.execute("UPDATE escalations SET state = ?, attempts = attempts + ?, error = ? WHERE id = ?",
                             ("delivered" if delivered else "undelivered", attempts, error, escalation_id))

    def undelivered_escalations(self) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute("SELECT time, request_id, attempts, error, payload FROM escalations "
                                    "WHERE state = 'undelivered' ORDER BY id").fetchall()
        return [{"time": t, "request_id": r, "attempts": a, "error": e, "payload": json.loads(p)}
                for t, r, a, e, p in rows]

    def query(self, *, flagged: bool | None = None, topic: str | None = None, since: str | None = None,
              until: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        clauses: list[str] = []
        args: list[str | int] = []
        if flagged is not None:
            clauses.append("flagged = ?")
            args.append(int(flagged))
        if topic:
            clauses.append("topic = ?")
            args.append(topic)
        if since:
            clauses.append("time >= ?")
            args.append(since)
        if until:
            clauses.append("time < ?")
            args.append(until)
        where = " WHERE " + " AND ".join(clauses) if clauses else ""
        sql = f"SELECT {', '.join(COLUMNS)} FROM decisions{where} ORDER BY id"
        if limit:
            sql += f" LIMIT {int(limit)}"
        with self._lock:
            rows = self._db.execute(sql, args).fetchall()
        return [_row(dict(zip(COLUMNS, r, strict=True))) for r in rows]

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _sql(value: Any) -> Any:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, str):
        return utf8(value)
    return value


def _row(raw: dict[str, Any]) -> dict[str, Any]:
    for key in _BOOLS:
        raw[key] = bool(raw[key])
    for key in _JSON:
        raw[key] = json.loads(raw[key]) if raw[key] else None
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
