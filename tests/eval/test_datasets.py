import json

import pytest

from morphguard.eval import datasets
from morphguard.eval.datasets import DatasetError, Item


def write_lines(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_jsonl_takes_a_string_or_a_list_of_passages_and_optional_spans(tmp_path):
    path = write_lines(tmp_path / "mine.jsonl", [
        {"question": "q1", "context": "one passage", "answer": "a1", "hallucinated": False},
        {"id": "x", "question": "q2", "context": ["p1", "p2"], "answer": "abcdef", "hallucinated": True,
         "spans": [{"start": 1, "end": 3}]},
    ])
    first, second = datasets.load(f"jsonl:{path}")
    assert first.passages == ["one passage"] and first.id == "1" and first.spans is None
    assert second.id == "x" and second.passages == ["p1", "p2"] and second.spans[0].end == 3


@pytest.mark.parametrize("record, message", [
    ({"question": "q", "context": "c", "answer": "a"}, ":1: hallucinated: Field required"),
    ({"question": "q", "context": "c", "answer": "abc", "hallucinated": True, "spans": [{"start": 2, "end": 9}]},
     ":1: span 2-9 is outside the answer"),
])
def test_bad_jsonl_names_the_line_and_the_field(tmp_path, record, message):
    path = write_lines(tmp_path / "bad.jsonl", [record])
    with pytest.raises(DatasetError, match=message):
        datasets.load(f"jsonl:{path}")


def test_missing_data_says_where_it_looked(tmp_path):
    with pytest.raises(DatasetError, match="cannot read .*test_all.jsonl"):
        datasets.load("ragtruth", tmp_path)
    with pytest.raises(DatasetError, match="unknown dataset 'nope'"):
        datasets.load("nope", tmp_path)


def test_ragtruth_qa_context_becomes_passages_and_labels_become_spans(tmp_path):
    (tmp_path / "ragtruth").mkdir()
    write_lines(tmp_path / "ragtruth" / "test_qa.jsonl", [{
        "id": "7", "task_type": "QA", "question": "who?",
        "context": "passage 1:Alice wrote it.\n\npassage 2:Bob read it.",
        "answer": "Carol wrote it.", "hallucinated": True,
        "labels": [{"start": 0, "end": 5, "text": "Carol", "label_type": "Evident Conflict"}]}])
    (item,) = datasets.load("ragtruth-qa", tmp_path)
    assert item.id == "ragtruth/7" and item.passages == ["Alice wrote it.", "Bob read it."]
    assert [(s.start, s.end) for s in item.spans] == [(0, 5)]


def test_halueval_gives_a_faithful_and_a_hallucinated_item_per_record(tmp_path):
    folder = tmp_path / "halueval" / "RUCAIBox_HaluEval" / "generation" / "qa"
    folder.mkdir(parents=True)
    write_lines(folder / "qa_one-turn_data.json", [
        {"knowledge": "K", "question": "Q", "right_answer": "R", "hallucinated_answer": "H"}])
    right, wrong = datasets.load("halueval", tmp_path)
    assert (right.answer, right.hallucinated, wrong.answer, wrong.hallucinated) == ("R", False, "H", True)
    assert right.spans is None


def test_faithbench_counts_only_unwanted_annotations(tmp_path):
    folder = tmp_path / "faithbench" / "vectara_FaithBench" / "data_for_release"
    folder.mkdir(parents=True)
    annotation = {"summary_start": 0, "summary_end": 4, "label": ["Benign"]}
    (folder / "batch_1.json").write_text(json.dumps({"samples": [
        {"sample_id": 1, "source": "S", "summary": "Sum one.", "annotations": [annotation]},
        {"sample_id": 2, "source": "S", "summary": "Sum two.",
         "annotations": [annotation, {**annotation, "summary_start": 4, "summary_end": 7,
                                      "label": ["Unwanted", "Unwanted.Extrinsic"]}]},
    ]}))
    benign, unwanted = datasets.load("faithbench", tmp_path)
    assert not benign.hallucinated and benign.spans == []
    assert unwanted.hallucinated and [(s.start, s.end) for s in unwanted.spans] == [(4, 7)]


def _items(n_per_stratum=10):
    return [Item(id=f"{task}-{label}-{i}", task=task, question="q", passages=["p"], answer="a", hallucinated=label)
            for task in ("QA", "Summary") for label in (False, True) for i in range(n_per_stratum)]


def test_sample_is_deterministic_and_balances_the_strata():
    items = _items()
    first = datasets.sample(items, 8, seed=0)
    assert [i.id for i in first] == [i.id for i in datasets.sample(list(reversed(items)), 8, seed=0)]
    assert [i.id for i in first] != [i.id for i in datasets.sample(items, 8, seed=1)]
    strata = {(i.task, i.hallucinated) for i in first}
    assert len(strata) == 4 and len(first) == 8
    assert sum(i.task == "QA" and i.hallucinated for i in first) == 2


def test_sample_fills_from_larger_strata_when_one_runs_out():
    items = _items()[:12]  # QA faithful 10, QA hallucinated 2
    chosen = datasets.sample(items, 8)
    assert sum(i.hallucinated for i in chosen) == 2 and len(chosen) == 8


def test_split_is_disjoint_and_stratified():
    dev, test = datasets.split(_items(), seed=0)
    assert not {i.id for i in dev} & {i.id for i in test}
    assert len(dev) == len(test) == 20
    assert sum(i.hallucinated for i in dev) == 10


@pytest.mark.shared_data
def test_the_shared_ragtruth_loads_with_valid_spans():
    items = datasets.load("ragtruth")
    assert len(items) == 1041 and sum(i.hallucinated for i in items) == 417
    assert all(0 <= s.start < s.end <= len(i.answer) for i in items for s in i.spans)
    assert {i.task for i in items} == {"QA", "Summary", "Data2txt"}


@pytest.mark.shared_data
def test_halves_keep_every_source_on_one_side_and_never_move():
    items = datasets.load("ragtruth")
    sides: dict[str, set[str]] = {}
    for item in items:
        sides.setdefault(item.group, set()).add(datasets.half_of(item))
    assert all(len(s) == 1 for s in sides.values())  # the six answers to one source stay together
    counts = {h: sum(datasets.half_of(i) == h for i in items) for h in datasets.HALVES}
    assert min(counts.values()) > 0.35 * len(items)
    # Pinned: the split is part of every reported figure and must never change silently.
    assert [datasets.half_of(i) for i in items[::97][:8]] == ["fit", "fit"] + ["report"] * 4 + ["fit", "fit"]


@pytest.mark.shared_data
def test_the_calibration_split_never_separates_a_group():
    items = datasets.load("ragtruth-qa")
    dev, test = datasets.split(items)
    assert {i.group for i in dev}.isdisjoint({i.group for i in test})
    assert len(dev) + len(test) == len(items)


def test_the_contrast_builder_reads_items_without_importing_the_readers_that_call_it():
    """`datasets` loads `contrast` sets by calling `contrast.build`; `contrast` builds on `items` alone, so the two
    modules import one way only."""
    import ast
    from pathlib import Path

    import morphguard.eval.contrast as contrast_module

    tree = ast.parse(Path(contrast_module.__file__).read_text(encoding="utf-8"))
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert "morphguard.eval.items" in imported
    assert not {name for name in imported if name.startswith("morphguard.eval.datasets")}
