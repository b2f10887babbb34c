"""Benchmark items from the shared data folder (RAGTruth, HaluEval QA, FaithBench) or any JSONL file.

Every loader yields `Item`s: a question, the passages, an answer, the gold answer-level label and, where
the dataset has them, gold spans as character offsets into the answer. Named datasets are read from
`<project>/../shared/data` unless a data directory is given; nothing is copied into the project.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path

from pydantic import ValidationError

from morphguard.config import Config
from morphguard.errors import MorphguardError
from morphguard.eval import contrast
from morphguard.eval.items import Item, Span

# What each RAGTruth / FaithBench generator was asked to do, restated as the "question" a detector sees.
_TASK_QUESTIONS = {
    "Summary": "Summarize the news article in the passages.",
    "Data2txt": "Write an objective overview of the local business described by the structured data in the passages.",
    "FaithBench": "Summarize the passage.",
}

_RAGTRUTH_TASKS = {"qa": "QA", "summary": "Summary", "data2txt": "Data2txt"}


class DatasetError(MorphguardError):
    """A dataset that cannot be found or read."""


def default_data_dir() -> Path:
    return Path(__file__).resolve().parents[2].parent / "shared" / "data"


def load(name: str, data_dir: Path | None = None, config: Config | None = None) -> list[Item]:
    """`ragtruth`, `ragtruth-qa|summary|data2txt`, the same for `contrast`, `contrast-short` and `contrast-brief`
    (eval/contrast.py), `halueval`, `faithbench`, `reviews` (the review console's judgements, from the config's audit
    store) or `jsonl:PATH`."""
    data_dir = data_dir or default_data_dir()
    if name == "reviews":
        return load_reviews(config or Config())
    if name.startswith("jsonl:"):
        return list(load_jsonl(Path(name.removeprefix("jsonl:"))))
    if name == "ragtruth":
        return list(load_ragtruth(data_dir / "ragtruth" / "test_all.jsonl"))
    if name.startswith("ragtruth-") and name.removeprefix("ragtruth-") in _RAGTRUTH_TASKS:
        return list(load_ragtruth(data_dir / "ragtruth" / f"test_{name.removeprefix('ragtruth-')}.jsonl"))
    for base in ("contrast-brief", "contrast-short", "contrast"):
        if name == base or name.startswith(f"{base}-") and name.removeprefix(f"{base}-") in _RAGTRUTH_TASKS:
            return list(contrast.build(load(name.replace(base, "ragtruth"), data_dir), form=base))
    if name == "halueval":
        return list(load_halueval(data_dir / "halueval" / "RUCAIBox_HaluEval" / "generation" / "qa"
                                  / "qa_one-turn_data.json"))
    if name == "faithbench":
        return list(load_faithbench(data_dir / "faithbench" / "vectara_FaithBench" / "data_for_release"))
    names = [f"{base}{t}" for base in ("ragtruth", "contrast", "contrast-short", "contrast-brief")
             for t in ("", *(f"-{t}" for t in _RAGTRUTH_TASKS))]
    names += ["halueval", "faithbench", "reviews", "jsonl:PATH"]
    raise DatasetError(f"unknown dataset {name!r}; choose one of {', '.join(names)}")


def load_reviews(config: Config) -> list[Item]:
    """Decisions people judged hallucinated or faithful in the review console, with the text the audit kept.

    Each item keeps the decision's topic, so proposed thresholds come per topic as policy chose it; unsure
    judgements and decisions whose text was not kept are left out.
    """
    from morphguard.policy.audit import AuditStore  # the audit store is only needed for this dataset
    from morphguard.policy.reviews import ReviewStore

    settings = config.policy.audit
    if config.store.url is None and not Path(settings.path).is_file():
        raise DatasetError(f"no audit store at {settings.path} (policy.audit.path)")
    store = AuditStore(settings, config.store)
    try:
        rows = ReviewStore(store).labelled()
    finally:
        store.close()
    return [Item(id=f"review-{r['id']}", task="review", topic=r["topic"], question=r["question"],
                 passages=[p for p in (r["context"] or "").split("\n\n") if p.strip()] or [""], answer=r["answer"],
                 hallucinated=r["review"] == "hallucinated", group=r["request_id"]) for r in rows]


def _lines(path: Path) -> Iterator[tuple[int, dict]]:
    try:
        handle = path.open(encoding="utf-8")
    except OSError as exc:
        raise DatasetError(f"cannot read {path}: {exc.strerror or exc} (set --data-dir?)") from None
    with handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as exc:
                raise DatasetError(f"{path}:{number}: not valid JSON ({exc})") from None
            except RecursionError:  # the decoder recurses once per level of nesting
                raise DatasetError(f"{path}:{number}: the JSON is nested too deeply to read") from None
            if not isinstance(record, dict):
                raise DatasetError(f"{path}:{number}: expected a JSON object")
            yield number, record


def load_jsonl(path: Path) -> Iterator[Item]:
    """`{question, context, answer, hallucinated, spans?, id?, task?}` per line; context a string or a list."""
    for number, record in _lines(path):
        fields = {"id": str(record.get("id", number)), "task": str(record.get("task", "jsonl")),
                  "question": record.get("question") or "", "passages": record.get("context"),
                  "answer": record.get("answer"), "hallucinated": record.get("hallucinated"),
                  "spans": record.get("spans"), "group": record.get("group")}
        try:
            item = Item.model_validate({k: v for k, v in fields.items() if v is not None})
        except ValidationError as exc:
            problem = exc.errors()[0]
            where = ".".join(str(p) for p in problem["loc"]).replace("passages", "context")
            raise DatasetError(f"{path}:{number}: {where}: {problem['msg']}") from None
        for span in item.spans or []:
            if not span.start < span.end <= len(item.answer):
                raise DatasetError(f"{path}:{number}: span {span.start}-{span.end} is outside the answer")
        yield item


def load_ragtruth(path: Path) -> Iterator[Item]:
    for _, r in _lines(path):
        task = r["task_type"]
        if task == "QA":
            # "passage 1:...\n\npassage 2:..." → one passage each, without the label.
            passages = [re.sub(r"^passage \d+:\s*", "", p.strip()) for p in r["context"].split("\n\n") if p.strip()]
        else:
            passages = [r["context"]]
        yield Item(id=f"ragtruth/{r['id']}", task=task, question=r.get("question") or _TASK_QUESTIONS[task],
                   passages=passages, answer=r["answer"], hallucinated=bool(r["hallucinated"]),
                   spans=[Span(start=s["start"], end=s["end"]) for s in r["labels"]],
                   group=f"ragtruth/{r['source_id']}" if r.get("source_id") is not None else None)


def load_halueval(path: Path) -> Iterator[Item]:
    """Two items per HaluEval QA record: the right answer (faithful) and the hallucinated one."""
    for number, r in _lines(path):
        for suffix, answer, hallucinated in (("right", r["right_answer"], False),
                                              ("hallucinated", r["hallucinated_answer"], True)):
            yield Item(id=f"halueval/{number}/{suffix}", task="QA", question=r["question"],
                       passages=[r["knowledge"]], answer=answer, hallucinated=hallucinated,
                       group=f"halueval/{number}")


def load_faithbench(folder: Path) -> Iterator[Item]:
    """A summary is hallucinated when any annotator marked an "Unwanted" span; those spans are the gold."""
    batches = sorted(folder.glob("batch_*.json"), key=lambda p: int(re.sub(r"\D", "", p.stem) or 0))
    if not batches:
        raise DatasetError(f"no FaithBench batches in {folder} (set --data-dir?)")
    for batch in batches:
        for sample in json.loads(batch.read_text(encoding="utf-8"))["samples"]:
            spans = [Span(start=a["summary_start"], end=a["summary_end"]) for a in sample["annotations"]
                     if any(str(label).startswith("Unwanted") for label in a["label"])
                     and a.get("summary_start") is not None and a["summary_end"] > a["summary_start"]]
            yield Item(id=f"faithbench/{batch.stem}/{sample['sample_id']}", task="FaithBench",
                       question=_TASK_QUESTIONS["FaithBench"], passages=[sample["source"]],
                       answer=sample["summary"], hallucinated=bool(spans), spans=spans)


HALVES = ("fit", "report")


def half_of(item: Item) -> str:
    """`fit` or `report`: the half an item belongs to, fixed for good by a hash of its group.

    Everything that is chosen or tuned (profiles, features, coefficients, thresholds) is chosen on `fit`;
    figures are reported on `report`. Hashing the group keeps all answers to one source on one side, so a
    detector never meets on `report` a context it was tuned on, and no seed or file has to be kept.
    """
    digest = hashlib.sha256(f"morphguard-half/{item.group or item.id}".encode()).digest()
    return HALVES[digest[0] & 1]


def load_half(name: str, half: str | None, data_dir: Path | None = None, config: Config | None = None) -> list[Item]:
    """The items of dataset `name` on one half (`None`: all of them)."""
    return [i for i in load(name, data_dir, config) if half is None or half_of(i) == half]


def sample(items: Iterable[Item], limit: int | None, seed: int = 0) -> list[Item]:
    """A deterministic sample with the strata (task × label) as equal as their sizes allow.

    Balanced rather than proportional: with a few dozen items, a proportional draw leaves the rare
    stratum (e.g. hallucinated QA) with one or two items and the curves meaningless.
    """
    items = list(items)
    if limit is None or limit >= len(items):
        return items
    strata: dict[tuple[str, bool], list[Item]] = defaultdict(list)
    for item in items:
        strata[(item.task, item.hallucinated)].append(item)
    rng = random.Random(seed)
    queues = []
    for key in sorted(strata):
        members = sorted(strata[key], key=lambda i: i.id)
        rng.shuffle(members)
        queues.append(members)
    chosen: list[Item] = []
    while len(chosen) < limit:  # round robin over the strata, skipping the exhausted ones
        for queue in queues:
            if queue and len(chosen) < limit:
                chosen.append(queue.pop(0))
    return chosen


def split(items: list[Item], dev_share: float = 0.5, seed: int = 0) -> tuple[list[Item], list[Item]]:
    """A disjoint dev/test split for threshold calibration: whole groups, stratified by task × label of the
    group's first item, so two answers to one source never sit on both sides."""
    groups: dict[str, list[Item]] = defaultdict(list)
    for item in items:
        groups[item.group or item.id].append(item)
    strata: dict[tuple[str, bool], list[str]] = defaultdict(list)
    for key, members in groups.items():
        strata[(members[0].task, any(i.hallucinated for i in members))].append(key)
    rng = random.Random(seed + 1)
    dev: list[Item] = []
    test: list[Item] = []
    for stratum in sorted(strata):
        keys = sorted(strata[stratum])
        rng.shuffle(keys)
        cut = round(len(keys) * dev_share)
        dev += [i for key in keys[:cut] for i in groups[key]]
        test += [i for key in keys[cut:] for i in groups[key]]
    return dev, test
