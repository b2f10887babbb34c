import asyncio
import os
import subprocess
import sys
from collections import Counter

import pytest

from morphguard.config import Config
from morphguard.detectors import build_detector
from morphguard.detectors.text import sentences
from morphguard.eval import contrast, datasets, metrics
from morphguard.eval.items import Item
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


def test_edits_change_claims_not_talk_about_the_sources_or_capitals_that_name_nothing():
    item = faithful("Based on the passages provided, the steps are as follows:\n1. Ibuprofen is avoided late in "
                    "pregnancy, says Smith.",
                    "Smith and Jones wrote on pain.\n- The drug is avoided late in pregnancy, says Smith.")
    negated, span = contrast._negation(item, 0)
    assert negated[span.start:span.end] == "1. Ibuprofen is not avoided late in pregnancy, says Smith."
    # "The" opens a list item of the context: capitalised, and not after a full stop, but no name to swap in
    for rank in range(4):
        assert contrast._entity(item, rank)[0].endswith("says Jones.")
    assert contrast._negation(faithful("The passages do not say.", "Nothing."), 0) is None


def test_a_dropped_qualifier_is_the_sources_and_a_swapped_name_is_another_name():
    item = faithful("Here are some ways to use it. It typically eases pain, at up to 200 mg a day.",
                    "It eases pain. Take up to 200 mg a day.")
    # "some" hedges no claim and the context states no "typically": dropping either makes no error
    assert contrast._qualifier(item, 0)[0] == "Here are some ways to use it. It typically eases pain, at 200 mg a day."
    assert contrast._qualifier(faithful("It typically eases pain.", "It eases pain."), 0) is None
    item = faithful("A water pick, also known as a Waterpik, cleans teeth.",
                    "The Waterpik, sold as the Water Pik or Pik, cleans teeth. Dr Brown tested it.")
    for rank in range(4):  # the same device spelt otherwise is no swap
        assert "Brown" in contrast._entity(item, rank)[0]


@pytest.mark.shared_data
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


@pytest.mark.shared_data
def test_vocabulary_alone_cannot_tell_the_pairs_apart():
    items = datasets.load("contrast-qa")
    detector = build_detector(Config(), name="grounding")
    found = [asyncio.run(detector.detect(RagInput(question=i.question, passages=i.passages), i.answer)).features
             for i in items]
    labels = [i.hallucinated for i in items]
    assert abs(metrics.auroc(labels, [f["unsupported"] for f in found]) - 0.5) < 0.05
    assert abs(metrics.auroc(labels, [len(i.answer) for i in items]) - 0.5) < 0.1


def unaddressed(answer: str) -> str:
    """The answer without the instruction to the checker that the instruction pairs append."""
    return next((answer.removesuffix(t) for t in contrast._INSTRUCTIONS if answer.endswith(t)), answer)


@pytest.mark.shared_data
def test_the_short_form_keeps_each_pair_to_the_sentence_the_edit_changed():
    item = faithful("Ibuprofen eases pain. It is avoided in the third trimester, usually after week 28.",
                    "Ibuprofen eases pain. It is avoided in the third trimester, usually after week 28. "
                    "Paracetamol is preferred for pain relief during pregnancy.")
    pairs = {}
    for kind in ("negation", "qualifier", "added"):
        edit = contrast._EDITS[kind](item, 0)
        pairs[kind] = contrast._shorten(item, kind, *edit, instruction="")
    assert pairs["qualifier"][:2] == ("It is avoided in the third trimester, usually after week 28.",
                                      "It is avoided in the third trimester, after week 28.")
    assert pairs["added"][:2] == ("Paracetamol is preferred for pain relief during pregnancy.",
                                  "Paracetamol is not preferred for pain relief during pregnancy.")
    for _, edited, span in pairs.values():
        assert edited[span.start:span.end] == edited
    # The set itself: the same pairs and halves as the long form, each answer a single sentence.
    short = datasets.load("contrast-short-qa")
    long = datasets.load("contrast-qa")
    assert [i.id.replace("contrast-short/", "contrast/") for i in short] == [i.id for i in long]
    assert [datasets.half_of(i) for i in short] == [datasets.half_of(i) for i in long]
    assert all(len(sentences(unaddressed(i.answer))) == 1 for i in short)
    assert sum(len(i.answer) for i in short) < sum(len(i.answer) for i in long) / 3
    labels = [i.hallucinated for i in short]
    assert abs(metrics.auroc(labels, [len(i.answer) for i in short]) - 0.5) < 0.1


@pytest.mark.shared_data
def test_the_brief_form_puts_the_short_pairs_over_a_paragraph_of_their_own_context():
    """`contrast-brief`: the short pairs as they are, each over the few context sentences that bear on its faithful
    sentence, quoted as written, the same for both answers of a pair."""
    item = faithful("Paracetamol is preferred for pain in pregnancy.",
                    "Ibuprofen is avoided in the third trimester. " * 3
                    + " ".join(f"Ward {n} has {n + 10} beds." for n in range(40))
                    + " Paracetamol is preferred for pain relief during pregnancy.")
    cut = contrast._brief(item.passages, item.answer)
    assert cut[0].endswith("Paracetamol is preferred for pain relief during pregnancy.")
    assert "Ward 39 has" not in cut[0] and "…" not in cut[0] and len(cut[0]) <= contrast.BRIEF_CONTEXT
    brief, short = datasets.load("contrast-brief-qa"), datasets.load("contrast-short-qa")
    assert [i.id.replace("contrast-brief/", "contrast-short/") for i in brief] == [i.id for i in short]
    assert [(i.answer, i.hallucinated, i.spans, datasets.half_of(i)) for i in brief] == [
        (i.answer, i.hallucinated, i.spans, datasets.half_of(i)) for i in short]
    for n in range(0, len(brief), 2):
        assert brief[n].passages == brief[n + 1].passages  # one context for both answers of a pair
    for cut_item, whole_item in zip(brief, short, strict=True):
        context = " ".join(whole_item.passages)
        assert 0 < sum(len(p) for p in cut_item.passages) <= contrast.BRIEF_CONTEXT
        assert all(p[a:b] in context for p in cut_item.passages for a, b in sentences(p))


@pytest.mark.shared_data
def test_the_brief_contexts_are_the_same_in_every_process():
    """Which sentences a brief context keeps must not hang on the order a process's hash seed gives a set: a run folder
    pins each item's text and checks again any item that reads otherwise, so a flapping context threw stored judge
    replies away (it did, for three QA pairs whose candidate sentences tie, under hash seed 6)."""
    digest = ("import hashlib, json; from morphguard.eval import datasets; from morphguard.eval.runner import content; "
              "print(hashlib.sha256(json.dumps(content(datasets.load('contrast-brief-qa')), sort_keys=True)"
              ".encode()).hexdigest())")
    seen = {subprocess.run([sys.executable, "-c", digest], env={**os.environ, "PYTHONHASHSEED": seed},
                           capture_output=True, text=True, check=True).stdout for seed in ("0", "6")}
    assert len(seen) == 1
