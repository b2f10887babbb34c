"""What people said about flagged answers: the review queue, judgements, and what they add up to.

A judgement is its own row in `reviews` (who, when, which label, per-factoid labels, a note); the
decision it is about is never changed, and the newest judgement of a decision is its current one.
Queries page by keyset (the last row's id, or score and id), so a page costs the same at row 100,000
as at row 1. The console's sessions ended by logging out are kept here too, for every process to refuse.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Literal

import sqlalchemy as sa

from morphguard.policy.audit import (
    AuditStore,
    assignments,
    decisions,
    escalations,
    reviews,
    revoked_sessions,
    shadow_verdicts,
)
from morphguard.policy.record import now

Label = Literal["hallucinated", "faithful", "unsure"]
LABELS: tuple[Label, ...] = ("hallucinated", "faithful", "unsure")


@dataclass(frozen=True)
class QueueFilter:
    topic: str | None = None
    profile: str | None = None
    action: str | None = None
    since: str | None = None  # ISO times, as the table stores them
    until: str | None = None
    reviewed: bool | None = None  # None: both
    order: Literal["newest", "score"] = "newest"
    text: str | None = None  # words the question or the answer contains (case folded)
    assignee: str | None = None  # taken by this reviewer; "" for taken by nobody
    disagreed: bool = False  # instead of flagged and escalated answers: those a shadow candidate decided otherwise


def _latest_review() -> sa.ScalarSelect[Any]:
    return (sa.select(reviews.c.label).where(reviews.c.decision_id == decisions.c.id)
            .order_by(reviews.c.id.desc()).limit(1).scalar_subquery())


class ReviewStore:
    def __init__(self, audit: AuditStore) -> None:
        self.engine = audit.engine

    def queue(self, where: QueueFilter, after: str | None = None, limit: int = 50
              ) -> tuple[list[dict[str, Any]], str | None]:
        """One page of flagged or escalated decisions and the cursor of the next page (None: last page)."""
        c = decisions.c
        label = _latest_review().label("review")
        taken = (sa.select(assignments.c.reviewer).where(assignments.c.decision_id == c.id)
                 .scalar_subquery().label("assignee"))
        shadow = shadow_verdicts.c
        candidate = (sa.select(shadow.action).where(shadow.request_id == c.request_id)
                     .scalar_subquery().label("shadow_action"))
        shown = (sa.exists().where(shadow.request_id == c.request_id, shadow.changed.is_(True)) if where.disagreed
                 else sa.or_(c.flagged.is_(True), c.escalated.is_(True)))
        sql = (sa.select(c.id, c.time, c.request_id, c.profile, c.topic, c.score, c.threshold, c.action,
                         c.flagged, c.escalated, c.detector, c.question, c.factoids, label, taken, candidate)
               .where(shown))
        if where.text:  # a scan of the flagged rows' texts: the queue is the flagged share, and texts expire
            folded = where.text.lower()
            sql = sql.where(sa.or_(sa.func.lower(c.question).contains(folded, autoescape=True),
                                   sa.func.lower(c.answer).contains(folded, autoescape=True)))
        if where.assignee is not None:
            mine = sa.exists().where(assignments.c.decision_id == c.id)
            sql = sql.where(mine.where(assignments.c.reviewer == where.assignee) if where.assignee else ~mine)
        for column, value in ((c.topic, where.topic), (c.profile, where.profile), (c.action, where.action)):
            if value:
                sql = sql.where(column == value)
        if where.since:
            sql = sql.where(c.time >= where.since)
        if where.until:
            sql = sql.where(c.time < where.until)
        if where.reviewed is not None:
            exists = sa.exists().where(reviews.c.decision_id == c.id)
            sql = sql.where(exists if where.reviewed else ~exists)
        if where.order == "score":  # decisions with a score (checked ones), along the (score, id) index
            sql = sql.where(c.score.is_not(None))
            if after:
                last_score, last_id = _cursor(after)
                sql = sql.where(sa.or_(c.score < last_score, sa.and_(c.score == last_score, c.id < last_id)))
            sql = sql.order_by(c.score.desc(), c.id.desc())
        else:
            if after:
                sql = sql.where(c.id < int(_cursor(after)[1]))
            sql = sql.order_by(c.id.desc())
        with self.engine.connect() as db:
            rows = [dict(r) for r in db.execute(sql.limit(limit + 1)).mappings()]
        more = len(rows) > limit
        rows = rows[:limit]
        for row in rows:
            row["claim"] = _worst_claim(row.pop("factoids") or [])
            if str(row["question"]).startswith("sha256:"):
                row["question"] = None  # a hash is no question to show
        if not more or not rows:
            return rows, None
        last = rows[-1]
        cursor = f"{last['score']!r}:{last['id']}" if where.order == "score" else f"0:{last['id']}"
        return rows, cursor

    def neighbours(self, decision_id: int, where: QueueFilter) -> tuple[int | None, int | None]:
        """The items before and after this one in the (newest-first) queue, for moving through it."""
        c = decisions.c
        base = sa.select(c.id).where(sa.or_(c.flagged.is_(True), c.escalated.is_(True)))
        if where.reviewed is False:
            base = base.where(~sa.exists().where(reviews.c.decision_id == c.id))
        with self.engine.connect() as db:
            newer = db.execute(base.where(c.id > decision_id).order_by(c.id.asc()).limit(1)).scalar()
            older = db.execute(base.where(c.id < decision_id).order_by(c.id.desc()).limit(1)).scalar()
        return newer, older

    def decision(self, decision_id: int) -> dict[str, Any] | None:
        with self.engine.connect() as db:
            row = db.execute(sa.select(decisions).where(decisions.c.id == decision_id)).mappings().first()
        if row is None:
            return None
        out = dict(row)
        out["factoids"] = out["factoids"] or []
        return out

    def assignee(self, decision_id: int) -> str | None:
        with self.engine.connect() as db:
            return db.execute(sa.select(assignments.c.reviewer)
                              .where(assignments.c.decision_id == decision_id)).scalar()

    def take(self, decision_id: int, reviewer: str) -> str:
        """Assign the decision to `reviewer` unless another holds it; returns who holds it now. An unknown
        decision is a KeyError."""
        if self.decision(decision_id) is None:
            raise KeyError(decision_id)
        try:
            with self.engine.begin() as db:
                db.execute(assignments.insert().values(decision_id=decision_id, reviewer=reviewer, time=now()))
        except sa.exc.IntegrityError:
            pass  # taken already: by this reviewer, or by another who keeps it
        return self.assignee(decision_id) or reviewer

    def release(self, decision_id: int, reviewer: str) -> None:
        """Give the decision back, if `reviewer` holds it."""
        with self.engine.begin() as db:
            db.execute(assignments.delete().where(assignments.c.decision_id == decision_id,
                                                  assignments.c.reviewer == reviewer))

    def delivery(self, request_id: str) -> str | None:
        """What became of the decision's escalation: pending, delivered or undelivered (None: none)."""
        with self.engine.connect() as db:
            return db.execute(sa.select(escalations.c.state).where(escalations.c.request_id == request_id)
                              .order_by(escalations.c.id.desc()).limit(1)).scalar()

    def judgements(self, decision_id: int) -> list[dict[str, Any]]:
        with self.engine.connect() as db:
            rows = db.execute(sa.select(reviews).where(reviews.c.decision_id == decision_id)
                              .order_by(reviews.c.id.desc())).mappings().all()
        return [dict(r) for r in rows]

    def judge(self, decision_id: int, reviewer: str, label: str, factoid_labels: dict[int, str] | None = None,
              note: str = "") -> int:
        """Record a judgement; labels outside LABELS are a ValueError, an unknown decision a KeyError."""
        if label not in LABELS or any(v not in LABELS for v in (factoid_labels or {}).values()):
            raise ValueError(f"label must be one of {', '.join(LABELS)}")
        decision = self.decision(decision_id)
        if decision is None:
            raise KeyError(decision_id)
        with self.engine.begin() as db:
            return int(db.execute(reviews.insert().values(
                time=now(), decision_id=decision_id, request_id=decision["request_id"], reviewer=reviewer,
                label=label, factoids=json.loads(json.dumps({str(k): v for k, v in (factoid_labels or {}).items()})),
                note=note).returning(reviews.c.id)).scalar_one())

    def export(self) -> list[dict[str, Any]]:
        """Every judgement with the decision it is about (no texts: those stay in the store)."""
        d, r = decisions.c, reviews.c
        sql = (sa.select(r.id.label("review_id"), r.time, r.reviewer, r.label, r.factoids, r.note,
                         d.id.label("decision_id"), d.request_id, d.trace_id, d.profile, d.topic, d.score,
                         d.threshold, d.flagged, d.action, d.escalated, d.detector)
               .join(decisions, d.id == r.decision_id).order_by(r.id))
        with self.engine.connect() as db:
            return [dict(row) for row in db.execute(sql).mappings()]

    def labelled(self) -> list[dict[str, Any]]:
        """Decisions whose current judgement is hallucinated or faithful and whose text was kept."""
        c = decisions.c
        label = _latest_review().label("review")
        sql = (sa.select(c.id, c.request_id, c.topic, c.profile, c.score, c.question, c.answer, c.context, label)
               .where(sa.exists().where(reviews.c.decision_id == c.id)).order_by(c.id))
        with self.engine.connect() as db:
            rows = [dict(r) for r in db.execute(sql).mappings()]
        return [r for r in rows if r["review"] in ("hallucinated", "faithful") and text_kept(r)]

    def topic_summary(self) -> list[dict[str, Any]]:
        """Per topic: decisions, flagged share, and of the reviewed flags how many reviewers confirmed."""
        c = decisions.c
        label = _latest_review()
        sql = (sa.select(c.topic, sa.func.count().label("decisions"),
                         sa.func.sum(sa.case((c.flagged.is_(True), 1), else_=0)).label("flagged"),
                         sa.func.sum(sa.case((sa.and_(c.flagged.is_(True), label == "hallucinated"), 1),
                                             else_=0)).label("confirmed"),
                         sa.func.sum(sa.case((sa.and_(c.flagged.is_(True), label == "faithful"), 1),
                                             else_=0)).label("dismissed"))
               .group_by(c.topic).order_by(c.topic))
        with self.engine.connect() as db:
            return [dict(r) for r in db.execute(sql).mappings()]

    def reviewed_scores(self) -> list[tuple[str, str, float, str]]:
        """(topic, day, score, label) of every reviewed, checked decision: the charts' raw material."""
        c = decisions.c
        label = _latest_review().label("review")
        sql = (sa.select(c.topic, c.time, c.score, label)
               .where(c.score.is_not(None), sa.exists().where(reviews.c.decision_id == c.id)))
        with self.engine.connect() as db:
            return [(t, str(time)[:10], float(s), lab) for t, time, s, lab in db.execute(sql)]

    def revoke_session(self, session_id: str, expires_at: float) -> None:
        """End a console session for every process that reads this store; rows of sessions past their own end
        go (those sessions are refused anyway)."""
        with self.engine.begin() as db:
            db.execute(revoked_sessions.delete().where(revoked_sessions.c.expires_at < time.time()))
        try:
            with self.engine.begin() as db:
                db.execute(revoked_sessions.insert().values(session_id=session_id, expires_at=expires_at))
        except sa.exc.IntegrityError:
            pass  # revoked already: two tabs logged out at once

    def session_revoked(self, session_id: str) -> bool:
        with self.engine.connect() as db:
            return db.execute(sa.select(revoked_sessions.c.session_id)
                              .where(revoked_sessions.c.session_id == session_id)).first() is not None


def _worst_claim(factoids: list[dict[str, Any]]) -> str | None:
    """The text of the highest-scoring flagged factoid: what the queue shows of an answer."""
    flagged = [f for f in factoids if f.get("flagged")]
    return max(flagged, key=lambda f: f.get("score") or 0.0)["text"] if flagged else None


def _cursor(text: str) -> tuple[float, int]:
    """(score, id) of the last row of the previous page; a cursor that does not parse starts over."""
    score, _, row_id = text.partition(":")
    try:
        return float(score), int(row_id)
    except ValueError:
        return float("inf"), 2**62


def text_kept(row: dict[str, Any]) -> bool:
    """Whether the audit row holds the texts themselves (not hashes, not nothing)."""
    return all(row.get(k) and not str(row[k]).startswith("sha256:") for k in ("question", "answer"))
