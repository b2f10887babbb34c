"""The runner keeps every outcome on disk as it finishes and resumes a killed run where it stopped."""

import asyncio
import json

import pytest

from morphguard.errors import MorphguardError
from morphguard.eval import runner
from morphguard.eval.items import Item
from morphguard.models import Detection, Factoid, RagInput

ITEMS = [Item(id=f"i{n}", task="QA", question="q", passages=["p"], answer=f"answer {n}", hallucinated=n % 2 == 1)
         for n in range(4)]


class Counting:
    """A detector that scores by item number, records what it saw and can be told to fail."""

    name = "counting"

    def __init__(self, fail_on: set[str] = frozenset()):
        self.seen: list[str] = []
        self.fail_on = fail_on

    async def detect(self, rag: RagInput, answer: str) -> Detection:
        self.seen.append(answer)
        if answer in self.fail_on:
            raise RuntimeError("judge unreachable")
        score = int(answer.split()[-1]) / 4
        return Detection(detector=self.name, score=score, threshold=0.5, flagged=score >= 0.5,
                         factoids=[Factoid(text="x", start=0, end=6, score=score), Factoid(text="y", score=1.0)])


def run(detectors, folder, **kw):
    return asyncio.run(runner.run(ITEMS, detectors, folder, **kw))


def test_outcomes_are_written_as_they_finish_and_read_back(tmp_path):
    outcomes = run({"c": Counting()}, tmp_path, repeats=2, workers=3)
    assert len(outcomes) == 8
    lines = (tmp_path / runner.RESULTS).read_text().splitlines()
    assert len(lines) == 8 and all(json.loads(line)["detector"] == "c" for line in lines)
    first = next(o for o in outcomes if o.item_id == "i3" and o.repeat == 1)
    assert first.score == 0.75 and first.flagged and first.hallucinated
    # a factoid without a span is not a predicted span
    assert [(s.start, s.end) for s in first.factoid_spans] == [(0, 6)]


def test_a_killed_run_resumes_and_failed_checks_are_retried(tmp_path):
    flaky = Counting(fail_on={"answer 2"})
    first = run({"c": flaky}, tmp_path)
    assert sum(o.error is not None for o in first) == 1
    assert "judge unreachable" in next(o.error for o in first if o.error)
    with (tmp_path / runner.RESULTS).open("a") as sink:
        sink.write('{"detector": "c", "repeat": 0, "item_')  # a line cut short by a kill

    again = Counting()
    second = run({"c": again}, tmp_path)
    assert again.seen == ["answer 2"]  # only the failed one ran again
    assert len(second) == 4 and all(o.error is None for o in second)


def test_a_new_detector_in_the_same_folder_runs_only_itself(tmp_path):
    run({"a": Counting()}, tmp_path)
    a, b = Counting(), Counting()
    outcomes = run({"a": a, "b": b}, tmp_path)
    assert a.seen == [] and len(b.seen) == 4 and len(outcomes) == 8


def test_the_folder_refuses_a_different_sample(tmp_path):
    runner.prepare_folder(tmp_path, {"dataset": "ragtruth", "seed": 0, "items": ["a", "b"]})
    runner.prepare_folder(tmp_path, {"dataset": "ragtruth", "seed": 0, "items": ["a", "b"]})
    with pytest.raises(MorphguardError, match="different run .*items, seed"):
        runner.prepare_folder(tmp_path, {"dataset": "ragtruth", "seed": 1, "items": ["b", "c"]})


def test_results_under_other_settings_are_stale_and_run_again(tmp_path):
    run({"c": Counting()}, tmp_path, fingerprints={"c": "settings-1"})
    same, changed = Counting(), Counting()
    run({"c": same}, tmp_path, fingerprints={"c": "settings-1"})
    outcomes = run({"c": changed}, tmp_path, fingerprints={"c": "settings-2"})
    assert same.seen == [] and len(changed.seen) == 4
    assert {o.fingerprint for o in outcomes} == {"settings-2"}


def test_an_item_rebuilt_under_the_same_id_loses_its_outcomes_and_runs_again(tmp_path):
    pinned = {"dataset": "d", "seed": 0, "items": [i.id for i in ITEMS]}
    runner.prepare_folder(tmp_path, pinned)  # as a version that pinned no content wrote the folder
    run({"c": Counting()}, tmp_path)
    assert runner.prepare_folder(tmp_path, {**pinned, "content": runner.content(ITEMS)}) == []  # taken as it stands
    rewritten = [ITEMS[0], ITEMS[1].model_copy(update={"answer": "something else"}), *ITEMS[2:]]
    assert runner.rebuilt(tmp_path, rewritten) == ["i1"]  # what a script reading the folder directly is told
    assert runner.prepare_folder(tmp_path, {**pinned, "content": runner.content(rewritten)}) == ["i1"]
    assert runner.rebuilt(tmp_path, rewritten) == []
    assert {o.item_id for o in runner.load_outcomes(tmp_path)} == {"i0", "i2", "i3"}
    again = Counting()
    outcomes = asyncio.run(runner.run(rewritten, {"c": again}, tmp_path))
    assert again.seen == ["something else"] and len(outcomes) == 4
