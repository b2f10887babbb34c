"""A candidate's decisions beside the live ones, and the one report of them that a replay of stored traffic
(`policy.replay`) and the shadow (`settle.shadow`) both give: live action → candidate action, overall and by profile
and topic; flagging against the reviewers' labels for both; what the candidate's checks cost; the decisions that
changed."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

from morphguard.policy.engine import ACTIONS, ENDS_ANSWER


class Outcome(BaseModel):
    """One stored decision beside what the candidate made of it. `status`: `decided`; `no_text` (a check needs the
    texts, the row kept none); `pending` (the row holds no verdict yet: an async check still queued)."""

    row_id: int
    request_id: str
    time: str
    profile: str
    topic: str
    live_action: str
    live_flagged: bool
    live_score: float | None = None
    label: str | None = None  # the reviewers' current judgement: hallucinated, faithful, unsure
    status: Literal["decided", "no_text", "pending"] = "decided"
    candidate_profile: str | None = None
    candidate_topic: str | None = None
    action: str | None = None
    flagged: bool | None = None
    score: float | None = None
    threshold: float | None = None
    reason: str | None = None
    llm_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    seconds: float = 0.0

    @property
    def blocks(self) -> bool:
        """Whether the candidate would withhold the answer."""
        return self.action in ENDS_ANSWER

    @property
    def changed(self) -> bool:
        return self.status == "decided" and (self.action != self.live_action or self.flagged != self.live_flagged)


@dataclass
class Scores:
    """Precision, recall and F1 of flagging, against the reviewers' labels."""

    n: int = 0
    hallucinated: int = 0
    tp: int = 0
    fp: int = 0

    @property
    def precision(self) -> float | None:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else None

    @property
    def recall(self) -> float | None:
        return self.tp / self.hallucinated if self.hallucinated else None

    @property
    def f1(self) -> float | None:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p is not None and r is not None and p + r else None

    def add(self, hallucinated: bool, flagged: bool) -> None:
        self.n += 1
        self.hallucinated += hallucinated
        self.tp += hallucinated and flagged
        self.fp += flagged and not hallucinated


@dataclass
class Report:
    """What a candidate would have done: live action → candidate action, overall and by profile and topic; flagging
    against the reviewers' labels for both; what the candidate's checks cost."""

    rows: int = 0
    status: Counter[str] = field(default_factory=Counter)
    moves: Counter[tuple[str, str]] = field(default_factory=Counter)
    moves_by_group: dict[tuple[str, str], Counter[tuple[str, str]]] = field(default_factory=dict)
    live: Scores = field(default_factory=Scores)
    candidate: Scores = field(default_factory=Scores)
    llm_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    seconds: float = 0.0
    changed: list[Outcome] = field(default_factory=list)

    @classmethod
    def of(cls, outcomes: list[Outcome]) -> Report:
        report = cls()
        for o in sorted(outcomes, key=lambda o: o.row_id):
            report.rows += 1
            report.status[o.status] += 1
            if o.status != "decided":
                continue
            move = (o.live_action, str(o.action))
            report.moves[move] += 1
            report.moves_by_group.setdefault((o.profile, o.topic), Counter())[move] += 1
            if o.label in ("hallucinated", "faithful"):
                report.live.add(o.label == "hallucinated", o.live_flagged)
                report.candidate.add(o.label == "hallucinated", bool(o.flagged))
            report.llm_calls += o.llm_calls
            report.input_tokens += o.input_tokens
            report.output_tokens += o.output_tokens
            report.seconds += o.seconds
            if o.changed:
                report.changed.append(o)
        return report

    def summary(self) -> dict[str, Any]:
        def scores(s: Scores) -> dict[str, Any]:
            return {"n": s.n, "hallucinated": s.hallucinated, "precision": s.precision, "recall": s.recall,
                    "f1": s.f1}

        return {"rows": self.rows, "status": dict(self.status),
                "moves": [{"live": a, "candidate": b, "n": n} for (a, b), n in sorted(self.moves.items())],
                "by_group": [{"profile": p, "topic": t, "live": a, "candidate": b, "n": n}
                             for (p, t), moves in sorted(self.moves_by_group.items())
                             for (a, b), n in sorted(moves.items())],
                "labelled": {"live": scores(self.live), "candidate": scores(self.candidate)},
                "cost": {"llm_calls": self.llm_calls, "input_tokens": self.input_tokens,
                         "output_tokens": self.output_tokens, "seconds": round(self.seconds, 3)},
                "changed": len(self.changed), "would_block": self.would_block}

    @property
    def would_block(self) -> int:
        return sum(n for (_, b), n in self.moves.items() if b in ENDS_ANSWER)

    def render(self, title: str) -> str:
        lines = [title, "",
                 f"rows {self.rows}: " + ", ".join(f"{k} {v}" for k, v in sorted(self.status.items())), ""]
        lines += _matrix("live action → candidate action (all)", self.moves)
        for (profile, topic), moves in sorted(self.moves_by_group.items()):
            lines += _matrix(f"profile {profile}, topic {topic}", moves)
        lines += ["against the reviewers' labels (flagged = said unsupported)",
                  f"  {'':<10} {'n':>5} {'halluc.':>8} {'precision':>10} {'recall':>8} {'F1':>6}"]
        for name, s in (("live", self.live), ("candidate", self.candidate)):
            lines.append(f"  {name:<10} {s.n:>5} {s.hallucinated:>8} {_num(s.precision):>10} {_num(s.recall):>8} "
                         f"{_num(s.f1):>6}")
        lines += ["", f"the candidate's checks: {self.llm_calls} judge calls, {self.input_tokens} input and "
                      f"{self.output_tokens} output tokens, {self.seconds:.1f} s",
                  f"changed decisions: {len(self.changed)}; the candidate would block {self.would_block}", ""]
        return "\n".join(lines)


def _matrix(title: str, moves: Counter[tuple[str, str]]) -> list[str]:
    actions = sorted({a for a, _ in moves} | {b for _, b in moves}, key=_order)
    width = max(9, *(len(a) for a in actions))
    corner = "live \\ cand."
    first = max(len(corner), width)
    lines = [title, f"  {corner:<{first}} " + " ".join(f"{a:>{width}}" for a in actions)]
    for a in actions:
        if any(moves[(a, b)] for b in actions):
            lines.append(f"  {a:<{first}} " + " ".join(f"{moves[(a, b)] or '.':>{width}}" for b in actions))
    return [*lines, ""]


def _order(action: str) -> int:
    return ACTIONS.index(action) if action in ACTIONS else len(ACTIONS)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
