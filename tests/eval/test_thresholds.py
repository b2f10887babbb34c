import yaml

from morphguard.config import PolicySettings
from morphguard.eval.items import Item
from morphguard.eval.runner import Outcome
from morphguard.eval.thresholds import propose, snippet, threshold_for

LABELS = [True, True, True, True, False, False, False, False]
SCORES = [0.9, 0.8, 0.6, 0.2, 0.7, 0.3, 0.1, 0.05]


def test_recall_target_gives_the_strictest_threshold_that_reaches_it():
    assert threshold_for(LABELS, SCORES, recall=0.75) == 0.6  # catches 3 of 4
    assert threshold_for(LABELS, SCORES, recall=1.0) == 0.2


def test_precision_target_gives_the_loosest_threshold_whose_flags_are_right_often_enough():
    assert threshold_for(LABELS, SCORES, precision=0.75) == 0.6  # at 0.6: 3 of 4 flags right
    assert threshold_for(LABELS, SCORES, precision=1.0) == 0.8


def test_proposals_per_topic_become_a_policy_snippet_the_config_accepts():
    items, outcomes = [], []
    for n, (label, score) in enumerate(zip(LABELS * 2, SCORES * 2, strict=True)):
        subject = "dose of ibuprofen" if n < 8 else "visa for refugees"
        items.append(Item(id=str(n), task="QA", question=f"What about the {subject}?", passages=["p"], answer="a",
                          hallucinated=label))
        outcomes.append(Outcome(detector="d", repeat=0, item_id=str(n), task="QA", hallucinated=label, score=score))
    proposals = propose(items, outcomes, "d", PolicySettings(), recall=0.75)
    assert proposals["healthcare"]["threshold"] is None  # 4 labelled errors are too few to say
    assert proposals["(all)"] == {"threshold": 0.6, "n": 16, "hallucinated": 8}
    text = snippet(proposals, "d", "recall ≥ 0.75")
    assert PolicySettings.model_validate(yaml.safe_load(text)["policy"]).profiles["general"].threshold == 0.6
