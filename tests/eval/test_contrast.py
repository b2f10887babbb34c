import asyncio
from collections import Counter

from morphguard.config import Config
from morphguard.detectors import build_detector
from morphguard.eval import contrast, datasets, metrics
from morphguard.eval.datasets import Item
from morphguard.models import RagInput


def faithful(answer: str, context: str) -> Item:
    return Item(id="t/1", task="QA", question="q", passages=[context], answer=answer, hallucinated=False, group="g")


def test_each_kind_of_edit_changes_a_claim_and_marks_it():
    item = faithful("The drug is safe in the first trimester, at up to 200 mg a day.",
                    "The drug is safe in the first trimester. Doses up to 200 mg a day are allowed; 400 mg is not.")
    negated, span = contrast._negation(item, 0)
    assert negated == "The drug is not safe in the first trimester, at up to 200 mg a day."
    assert negated[span.start:span.end] == negated
    assert contrast._number(item, 0)[0] == "The drug is safe in the first trimester, at up to 400 mg a day."
    assert contrast._qualifier(item, 0)[0] == "The drug is safe in the first trimester, at 200 mg a day."
    added, span = contrast._added(faithful("Fine.", "Rain is common in the north of the island in May."), 0)
    assert added[span.start:span.end] == "Rain is not common in the north of the island in May."


def test_pairs_are_deterministic_kept_together_and_cover_every_kind():
    items = datasets.load("contrast-qa")
    assert [i.id for i in items] == [i.id for i in datasets.load("contrast-qa")]
    pairs = Counter(i.id.rsplit("/", 1)[0] for i in items)
    assert set(pairs.values()) == {2}
    assert {i.id.split("/")[-2] for i in items} == set(contrast.KINDS)
    by_id = {i.id: i for i in items}
    for item in items:
        if item.hallucinated:
            twin = by_id[item.id.replace("/edited", "/faithful")]
            assert twin.answer != item.answer and datasets.half_of(twin) == datasets.half_of(item)
            assert item.spans and item.spans[0].end <= len(item.answer)


def test_vocabulary_alone_cannot_tell_the_pairs_apart():
    items = datasets.load("contrast-qa")
    detector = build_detector(Config(), name="grounding")
    found = [asyncio.run(detector.detect(RagInput(question=i.question, passages=i.passages), i.answer)).features
             for i in items]
    labels = [i.hallucinated for i in items]
    assert abs(metrics.auroc(labels, [f["unsupported"] for f in found]) - 0.5) < 0.05
    assert abs(metrics.auroc(labels, [len(i.answer) for i in items]) - 0.5) < 0.1
