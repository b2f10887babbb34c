"""What a candidate config would have done with the traffic the audit trail holds (`morphguard replay`), and the
one report a replay and the shadow share.

A candidate is a partial config laid over the live one (`config.overlay_config`): a threshold, a profile, a topic
rule, a detector or a judge. A replay runs it at one of two depths:

- `decide`: each stored finding (the score, a failed check, a check not made) under the candidate's policy. No
  judge is asked, so it is fast and needs no kept text.
- `check`: the stored question, passages and answer through the candidate's detector and judge, then its policy.
  Only rows that kept their text (`policy.audit.keep_text`) can be checked again; the others are counted, never
  guessed.

What a row's way to the client allowed is not stored, so a replay assumes what the live path had: a stream checked
as it flows (the row says what it released) could withhold its rest, any other answer could be asked again.

A replay writes one line per row to its folder as it goes (`outcomes.jsonl`), so a rerun with the same folder
continues where it stopped. It reads the store in short pages by id, each its own transaction, so a running proxy
never waits for it (SQLite's readers do not block its writer; PostgreSQL's plain reads take no lock a write waits
for).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import sqlalchemy as sa

from morphguard.config import Config
from morphguard.errors import MorphguardError
from morphguard.fairness import on_behalf_of
from morphguard.llm.client import call_budget
from morphguard.models import Detection, RagInput
from morphguard.policy.audit import AuditStore, decisions, reviews
from morphguard.policy.comparison import Outcome
from morphguard.policy.engine import NO_CONTEXT, Finding, Holds, PolicyEngine, Reach
from morphguard.policy.reviews import text_kept

Depth = Literal["decide", "check"]
DEPTHS: tuple[Depth, ...] = ("decide", "check")
PAGE = 500  # rows read per transaction
PASSAGE_BREAK = "\n\n"  # how the audit row joins a request's passages (settle.values.CheckRequest)


@dataclass(frozen=True)
class RowFilter:
    """Which stored decisions a replay reads; the `audit` command's filters and a few more."""

    since: str | None = None  # ISO times, as the table stores them
    until: str | None = None
    profile: str | None = None
    topic: str | None = None
    route: str | None = None
    flagged: bool | None = None
    reviewed: bool | None = None

    def where(self) -> list[sa.ColumnElement[bool]]:
        c = decisions.c
        conditions = [column == value for column, value in ((c.profile, self.profile), (c.topic, self.topic),
                                                              (c.route, self.route)) if value]
        if self.since:
            conditions.append(c.time >= self.since)
        if self.until:
            conditions.append(c.time < self.until)
        if self.flagged is not None:
            conditions.append(c.flagged.is_(self.flagged))
        if self.reviewed is not None:
            reviewed = sa.exists().where(reviews.c.decision_id == c.id)
            conditions.append(reviewed if self.reviewed else ~reviewed)
        return conditions


def _label() -> sa.ScalarSelect[Any]:
    """A decision's current judgement: its newest review's label."""
    return (sa.select(reviews.c.label).where(reviews.c.decision_id == decisions.c.id)
            .order_by(reviews.c.id.desc()).limit(1).scalar_subquery())


def count(store: AuditStore, where: RowFilter) -> int:
    with store.engine.connect() as db:
        return int(db.execute(sa.select(sa.func.count()).select_from(decisions).where(*where.where())).scalar_one())


def stored(store: AuditStore, where: RowFilter, after: int = 0, page: int = PAGE) -> Iterator[dict[str, Any]]:
    """The decisions `where` selects, oldest first, each with its current review label (`review`), read a page at a
    time past row id `after`."""
    c = decisions.c
    while True:
        sql = (sa.select(decisions, _label().label("review")).where(c.id > after, *where.where())
               .order_by(c.id).limit(page))
        with store.engine.connect() as db:
            rows = [dict(r) for r in db.execute(sql).mappings()]
        yield from rows
        if len(rows) < page:
            return
        after = rows[-1]["id"]


def _finding(row: dict[str, Any]) -> Finding | None:
    """What the live check found, read back from its row; None while the row holds no verdict."""
    if row["threshold"] is None:
        return None
    if row["score"] is not None:
        return Finding(detection=Detection(detector=row["detector"] or "stored", score=row["score"],
                                           threshold=row["threshold"], flagged=bool(row["flagged"])))
    first = (row["reason"] or "").split(";")[0].strip()
    mode, _, code = first.partition(": ")
    if mode in ("fail_open", "fail_closed") and code:
        return Finding(failed=code)
    return Finding(skipped=first or NO_CONTEXT)


def _holds(row: dict[str, Any]) -> Holds:
    """What the row notes the check did not read (`PolicyEngine._noted`'s notes, read back)."""
    unreadable: tuple[str, ...] = ()
    for note in (row["reason"] or "").split(";"):
        name, _, parts = note.strip().partition(": ")
        if name == "unreadable_output":
            unreadable = tuple(p.strip() for p in parts.split(",") if p.strip())
    return Holds(unreadable=unreadable, tool_calls="tool_calls_unchecked" in (row["reason"] or ""))


def _texts(row: dict[str, Any]) -> bool:
    """Whether the row kept the question, answer and context themselves (not hashes, not nothing)."""
    return text_kept(row) and bool(row["context"]) and not str(row["context"]).startswith("sha256:")


def _rag(row: dict[str, Any]) -> RagInput:
    passages = [p for p in str(row["context"] or "").split(PASSAGE_BREAK) if p.strip()]
    return RagInput(question=row["question"], passages=passages)


class Replayer:
    """The candidate's policy (and at depth `check` its detector) applied to stored decisions."""

    def __init__(self, candidate: Config, depth: Depth, retag: bool = True, client: str = "replay") -> None:
        self.candidate = candidate
        self.depth = depth
        self.retag = retag
        self.client = client  # whose turn its judge calls and text threads wait in (`fairness`)
        self.engine = PolicyEngine(candidate.policy)
        self._detector: Any = None

    def _profile(self, row: dict[str, Any]) -> str:
        profiles = self.candidate.policy.profiles
        return row["profile"] if row["profile"] in profiles else self.candidate.policy.default_profile

    async def _topic(self, row: dict[str, Any], profile: str, rag: RagInput) -> str:
        """As stored, unless the candidate's topics differ from the live ones: then tagged again from the question and
        passages (the earlier turns the live tagger also read are not stored), in a thread, since the tagger reads the
        whole context (the shadow runs on the proxy's event loop)."""
        if self.retag:
            return await asyncio.to_thread(self.engine.topic_for, profile, rag)
        return str(row["topic"])

    async def outcome(self, row: dict[str, Any], rag: RagInput | None = None) -> Outcome:
        """What the candidate makes of a stored decision; `rag`: its question and passages where they are at hand
        (the shadow's), else read back from the row."""
        live = {"row_id": row["id"], "request_id": row["request_id"], "time": row["time"], "profile": row["profile"],
                "topic": row["topic"], "live_action": row["action"], "live_flagged": bool(row["flagged"]),
                "live_score": row["score"], "label": row.get("review")}
        finding = _finding(row)
        if finding is None:
            return Outcome(**live, status="pending")
        started = time.perf_counter()
        detection: Detection | None = None
        rag = rag or (_rag(row) if _texts(row) else None)
        if self.depth == "check" and finding.skipped is None:
            if rag is None:
                return Outcome(**live, status="no_text")
            finding, detection = await self._check(rag, row["answer"])
        profile = self._profile(row)
        topic = await self._topic(row, profile, rag) if rag is not None else str(row["topic"])
        reach = Reach.WITHHOLD if row["released_chars"] is not None else Reach.ASK_AGAIN
        decision = self.engine.decide(profile, topic, finding, _holds(row), reach)
        cost = detection.cost if detection is not None else None
        return Outcome(**live, candidate_profile=profile, candidate_topic=topic, action=decision.action,
                       flagged=decision.flagged, threshold=decision.threshold, reason=decision.reason,
                       score=finding.detection.score if finding.detection is not None else None,
                       llm_calls=cost.llm_calls if cost else 0, input_tokens=cost.input_tokens if cost else 0,
                       output_tokens=cost.output_tokens if cost else 0, seconds=time.perf_counter() - started)

    def detector(self) -> Any:
        """The candidate's detector, built on first use. Blocking (a model may load): the shadow builds it at start."""
        if self._detector is None:
            from morphguard.detectors import build_detector

            self._detector = build_detector(self.candidate)
        return self._detector

    async def _check(self, rag: RagInput, answer: str) -> tuple[Finding, Detection | None]:
        """The candidate's check, within the candidate's caps (a text past `max_text_chars` is not read; its judge
        calls stop at `max_judge_calls`) and in its client's turn."""
        limits = self.candidate.detector
        if limits.max_text_chars is not None and rag.size(answer) > limits.max_text_chars:
            return Finding(failed="check_too_large"), None
        try:
            with call_budget(limits.max_judge_calls), on_behalf_of(self.client):
                detection = await self.detector().detect(rag, answer)
        except MorphguardError as exc:  # the candidate's check failed: its on_error decides, as live
            return Finding(failed=type(exc).__name__), None
        return Finding(detection=detection), detection


class RunFolder:
    """A replay's folder: `run.json` (what is replayed), `outcomes.jsonl` (one line per row done, appended as each
    finishes) and, at the end, `report.txt`, `report.json` and `changed.jsonl`."""

    def __init__(self, folder: Path, identity: dict[str, Any]) -> None:
        self.folder = folder
        self.outcomes_path = folder / "outcomes.jsonl"
        folder.mkdir(parents=True, exist_ok=True)
        run = folder / "run.json"
        if run.exists():
            said = json.loads(run.read_text(encoding="utf-8"))
            if said != identity:
                raise MorphguardError(f"{folder} holds a replay of another candidate, depth or filter; give another "
                                      "--out (or remove the folder to start over)")
        else:
            run.write_text(json.dumps(identity, indent=2), encoding="utf-8")

    def done(self) -> list[Outcome]:
        if not self.outcomes_path.exists():
            return []
        out = []
        for line in self.outcomes_path.read_text(encoding="utf-8").splitlines():
            try:
                out.append(Outcome.model_validate_json(line))
            except ValueError:
                continue  # a line cut short when a run was stopped: that row is replayed again
        return out

    def append(self, outcomes: list[Outcome]) -> None:
        with self.outcomes_path.open("a", encoding="utf-8") as f:
            f.writelines(o.model_dump_json() + "\n" for o in outcomes)


def identity(candidate: Config, depth: Depth, where: RowFilter) -> dict[str, Any]:
    digest = hashlib.sha256(candidate.model_dump_json().encode()).hexdigest()[:16]
    return {"candidate": digest, "depth": depth, "filter": where.__dict__}


async def replay(store: AuditStore, live: Config, candidate: Config, depth: Depth, where: RowFilter, folder: Path, *,
                 workers: int = 4, limit: int | None = None,
                 progress: Callable[[int], None] = lambda n: None) -> list[Outcome]:
    """Replay the rows `where` selects (at most `limit`, those done in `folder` before counted) and return every
    outcome the folder holds. Rows are replayed `workers` at a time."""
    run = RunFolder(folder, identity(candidate, depth, where))
    outcomes = run.done()
    done = {o.row_id for o in outcomes}
    replayer = Replayer(candidate, depth, retag=live.policy.topics != candidate.policy.topics)
    room = None if limit is None else max(0, limit - len(done))
    gate = asyncio.Semaphore(workers)

    async def one(row: dict[str, Any]) -> Outcome:
        async with gate:
            return await replayer.outcome(row)

    async def flush(rows: list[dict[str, Any]]) -> None:
        fresh = await asyncio.gather(*(one(r) for r in rows))
        run.append(fresh)
        outcomes.extend(fresh)
        progress(len(fresh))

    batch: list[dict[str, Any]] = []
    for row in stored(store, where):
        if row["id"] in done:
            continue
        if room is not None:
            if room == 0:
                break
            room -= 1
        batch.append(row)
        if len(batch) == PAGE:
            await flush(batch)
            batch = []
    if batch:
        await flush(batch)
    return outcomes
