"""Runs detectors over benchmark items and keeps every outcome on disk as it finishes.

`results.jsonl` in the run folder gets one line per (detector, repeat, item), appended and flushed as
each check completes, so a killed run resumes where it stopped. Lines with an error are retried on resume;
a line cut short by a kill is ignored. `run.json` pins the dataset, sample and seed of the folder, so a
different run is never mixed into it, and a digest of what each item says: an item rebuilt with other words under
the same id (a change to the contrast set's edits, say) loses its outcomes and is checked again, rather than being
reported with the verdicts on its old text.
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
from morphguard.eval.items import Item, Span
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


def content(items: Sequence[Item]) -> dict[str, str]:
    """Per item, a digest of what it says: what the detectors read, and the labels the report scores it by."""
    return {i.id: hashlib.sha256(json.dumps(
        [i.question, i.passages, i.answer, i.hallucinated, [s.model_dump() for s in i.spans or []]],
        ensure_ascii=False).encode()).hexdigest()[:16] for i in items}


def prepare_folder(folder: Path, run: Mapping[str, object]) -> list[str]:
    """Create the run folder, or check that an existing one holds the same dataset sample. Where `run` pins the
    items' `content` and an item now says something else under the same id, that item's outcomes are stale: they
    are dropped, so that it is checked again. Returns the ids of the items so rebuilt."""
    folder.mkdir(parents=True, exist_ok=True)
    pinned = folder / RUN
    stale: list[str] = []
    if pinned.exists():
        before = json.loads(pinned.read_text(encoding="utf-8"))
        # A folder written before content was pinned lacks it and is taken as it stands, as that version took it.
        said, now = before.pop("content", None), run.get("content")
        rest = {k: v for k, v in run.items() if k != "content"}
        if before != rest:
            changed = sorted(k for k in set(before) | set(rest) if before.get(k) != rest.get(k))
            raise MorphguardError(f"{folder} holds a different run ({', '.join(changed)} differ); "
                                  f"choose another --out or delete it")
        if said == now or not isinstance(now, dict):
            return stale
        stale = _changed(said or {}, now)
        if stale:
            _drop(folder, set(stale))
    tmp = pinned.with_suffix(".tmp")
    tmp.write_text(json.dumps(dict(run), indent=2), encoding="utf-8")
    tmp.replace(pinned)
    return stale


def _changed(said: Mapping[str, str], now: Mapping[str, str]) -> list[str]:
    return [i for i, digest in said.items() if i in now and now[i] != digest]


def rebuilt(folder: Path, items: Sequence[Item]) -> list[str]:
    """The ids of `items` whose text differs from what the folder's outcomes were made on, for readers of a folder
    that do not go through `morphguard eval` (which checks such items again); none where it pins no content."""
    pinned = folder / RUN
    said = json.loads(pinned.read_text(encoding="utf-8")).get("content") if pinned.exists() else None
    return _changed(said or {}, content(items))


def _drop(folder: Path, items: set[str]) -> None:
    """Rewrite the folder's outcomes without those of `items` (a kill mid-way leaves the old file whole)."""
    kept = [o for o in load_outcomes(folder) if o.item_id not in items]
    tmp = folder / (RESULTS + ".tmp")
    tmp.write_text("".join(o.model_dump_json() + "\n" for o in kept), encoding="utf-8")
    tmp.replace(folder / RESULTS)


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
