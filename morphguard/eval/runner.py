"""Runs detectors over benchmark items and keeps every outcome on disk as it finishes.

`results.jsonl` in the run folder gets one line per (detector, repeat, item), appended and flushed as
each check completes, so a killed run resumes where it stopped. Lines with an error are retried on resume;
a line cut short by a kill is ignored. `run.json` pins the dataset, sample and seed of the folder and a digest
of what its items say, so a different run is never mixed into it: an item rebuilt with other words under the same
id (a change to the contrast set's edits, say) would otherwise be reported with the outcomes of its old text.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from pydantic import BaseModel, Field

from morphguard.detectors import Detector
from morphguard.errors import MorphguardError
from morphguard.eval.datasets import Item, Span
from morphguard.models import RagInput

log = logging.getLogger(__name__)

RESULTS = "results.jsonl"
RUN = "run.json"


class ScoredSpan(Span):
    score: float


class Outcome(BaseModel):
    """What one detector said about one item in one repeat, and what it cost."""

    detector: str
    repeat: int
    item_id: str
    task: str
    hallucinated: bool
    score: float | None = None
    threshold: float | None = None
    flagged: bool | None = None
    localizes: bool = True  # False: the detector never points at spans (length), so no span metrics
    factoid_spans: list[ScoredSpan] = Field(default_factory=list)
    factoid_scores: list[float] = Field(default_factory=list)  # every factoid's, located or not
    features: dict[str, float] = Field(default_factory=dict)  # the detector's numeric signals (Detection.features)
    llm_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    seconds: float = 0.0
    stage_seconds: dict[str, float] = Field(default_factory=dict)
    error: str | None = None
    fingerprint: str = ""  # the detector's settings; a result under other settings is stale, never reused

    @property
    def key(self) -> tuple[str, int, str]:
        return self.detector, self.repeat, self.item_id


def load_outcomes(folder: Path) -> list[Outcome]:
    path = folder / RESULTS
    if not path.exists():
        return []
    outcomes = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            outcomes.append(Outcome.model_validate_json(line))
        except ValueError:
            log.warning("%s:%d: unreadable line ignored (a run killed mid-write?)", path, number)
    return outcomes


def append_outcomes(folder: Path, outcomes: Sequence[Outcome]) -> None:
    with (folder / RESULTS).open("a", encoding="utf-8") as sink:
        for outcome in outcomes:
            sink.write(outcome.model_dump_json() + "\n")


def content(items: Sequence[Item]) -> str:
    """A digest of what the items say: what the detectors read, and the labels the report scores them by."""
    said = [[i.id, i.question, i.passages, i.answer, i.hallucinated, [s.model_dump() for s in i.spans or []]]
            for i in items]
    return hashlib.sha256(json.dumps(said, ensure_ascii=False).encode()).hexdigest()


# Pinned since a later version: a folder written before it was pinned lacks the key and is taken as it stands (with
# the key added), as that version took it.
_ADOPTED = ("content",)


def prepare_folder(folder: Path, run: Mapping[str, object]) -> None:
    """Create the run folder, or check that an existing one holds the same dataset sample."""
    folder.mkdir(parents=True, exist_ok=True)
    pinned = folder / RUN
    if pinned.exists():
        before = json.loads(pinned.read_text(encoding="utf-8"))
        older = {k: run[k] for k in _ADOPTED if k in run and k not in before}
        if {**before, **older} != dict(run):
            changed = sorted(k for k in set(before) | set(run) if before.get(k) != run.get(k))
            raise MorphguardError(f"{folder} holds a different run ({', '.join(changed)} differ); "
                                  f"choose another --out or delete it")
        if not older:
            return
    tmp = pinned.with_suffix(".tmp")
    tmp.write_text(json.dumps(dict(run), indent=2), encoding="utf-8")
    tmp.replace(pinned)


async def run(
    items: Sequence[Item],
    detectors: Mapping[str, Detector],
    folder: Path,
    *,
    repeats: int = 1,
    workers: int = 1,
    fingerprints: Mapping[str, str] | None = None,
    on_done: Callable[[Outcome], None] | None = None,
) -> list[Outcome]:
    """Every (detector, repeat, item) not already in the folder under the same settings is checked;
    all outcomes are returned."""
    fingerprints = fingerprints or {}
    done = {o.key: o for o in load_outcomes(folder)
            if o.error is None and o.fingerprint == fingerprints.get(o.detector, "")}
    todo = [(name, repeat, item) for repeat in range(repeats) for item in items for name in detectors
            if (name, repeat, item.id) not in done]
    limit = asyncio.Semaphore(workers)
    lock = asyncio.Lock()
    fresh: list[Outcome] = []

    with (folder / RESULTS).open("a", encoding="utf-8") as sink:
        async def one(name: str, repeat: int, item: Item) -> None:
            async with limit:
                outcome = await _check(detectors[name], name, repeat, item, fingerprints.get(name, ""))
            async with lock:
                sink.write(outcome.model_dump_json() + "\n")  # one write per line: a kill never splits two
                sink.flush()
                fresh.append(outcome)
            if on_done:
                on_done(outcome)

        await asyncio.gather(*(one(*job) for job in todo))
    wanted = {(name, repeat, item.id) for repeat in range(repeats) for item in items for name in detectors}
    merged = {**done, **{o.key: o for o in fresh}}
    return [o for key, o in merged.items() if key in wanted]


async def _check(detector: Detector, name: str, repeat: int, item: Item, fingerprint: str) -> Outcome:
    base = Outcome(detector=name, repeat=repeat, item_id=item.id, task=item.task, hallucinated=item.hallucinated,
                   localizes=getattr(detector, "localizes", True), fingerprint=fingerprint)
    try:
        d = await detector.detect(RagInput(question=item.question, passages=item.passages), item.answer)
    except Exception as exc:  # a failed check is recorded, reported and retried on resume, never fatal
        log.warning("%s failed on %s: %s", name, item.id, exc)
        return base.model_copy(update={"error": f"{type(exc).__name__}: {exc}"[:500]})
    return base.model_copy(update={
        "score": d.score, "threshold": d.threshold, "flagged": d.flagged,
        "factoid_spans": [ScoredSpan(start=f.start, end=f.end, score=f.score) for f in d.factoids
                          if f.start is not None and f.end is not None and f.end > f.start],
        "factoid_scores": [f.score for f in d.factoids], "features": d.features,
        "llm_calls": d.cost.llm_calls, "input_tokens": d.cost.input_tokens, "output_tokens": d.cost.output_tokens,
        "seconds": d.cost.seconds, "stage_seconds": {k: round(v.seconds, 3) for k, v in d.cost.stages.items()},
    })
