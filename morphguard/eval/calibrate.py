"""`morphguard calibrate`: the `sentences` check's calibration for the judge a team runs, or the `verifier` check's for
its model, from answers labelled right or wrong (the datasets `eval` knows, a JSONL file of the team's own, the review
console's judgements).

For `sentences`, each number from the labelled answers alone: the whole-answer verdict's weight in the fused score
(the one of `WEIGHTS` with the best AUROC), the logistic that turns the check's readings (`sentences.inputs`) into a
probability (one for prose, and one for answers about a structured record where there are labels enough of those),
and per-topic thresholds at a target recall over those probabilities. benchmarks/judge_quality.py fits the calibration
shipped beside the check with the same function (`calibration`). For `verifier`, whose score is its worst sentence's,
a logistic over that score's log-odds, and the thresholds. Either is written to a file with the judge or model it was
fitted with; `sentences.calibration` or `verifier.calibration` names the file, and a check with another judge or
model warns that it does not fit. The combined check's weights are fitted by `morphguard eval --fit` instead.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from morphguard.config import Config, VerifierSettings
from morphguard.detectors import resolve
from morphguard.detectors.judges import judge_identity
from morphguard.detectors.sentences import (
    Calibration,
    Logistic,
    SentencesSettings,
    calibrated,
    fused,
    inputs,
    score_log_odds,
)
from morphguard.detectors.verifier import identity as verifier_identity
from morphguard.errors import MorphguardError
from morphguard.eval import fit, metrics, thresholds
from morphguard.eval.items import Item
from morphguard.eval.runner import Outcome

WEIGHTS = (0.0, 0.25, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
MIN_LABELS = 5  # of each kind, below which a calibration says nothing
CALIBRATED = ("sentences", "verifier")


def calibration(parts: Sequence[Mapping[str, float]], labels: list[bool], sources: list[str],
                judge: Any) -> Calibration:
    """The calibration of the `sentences` check from its readings (`Detection.features`) of answers labelled
    `labels`, every source weighing the same: the whole-answer weight with the best AUROC, then a logistic over
    `sentences.inputs` for the answers about a structured record, where there are `MIN_LABELS` of each label among
    them, and one for the others (for all of them where the records have none of their own)."""
    if min(labels.count(True), labels.count(False)) < MIN_LABELS:
        raise MorphguardError(f"calibrating needs at least {MIN_LABELS} hallucinated and {MIN_LABELS} faithful "
                              f"answers checked; these have {labels.count(True)} and {labels.count(False)}")

    def auroc(weight: float) -> float:
        return metrics.auroc(labels, [fused(p, weight) for p in parts]) or 0.0

    weight = max(WEIGHTS, key=lambda w: (auroc(w), -abs(w - 0.6)))
    rows = [inputs(p, weight) for p in parts]
    names = sorted(rows[0])

    def fitted(chosen: list[int]) -> Logistic:
        coef, intercept = fit.logistic([rows[i] for i in chosen], names, [labels[i] for i in chosen],
                                       [sources[i] for i in chosen])
        return Logistic(coef=coef, intercept=intercept)

    record = [i for i, p in enumerate(parts) if p.get("record", 0.0) > 0]
    prose = [i for i in range(len(parts)) if i not in set(record)]

    def enough(chosen: list[int]) -> bool:
        return min(sum(labels[i] for i in chosen), sum(not labels[i] for i in chosen)) >= MIN_LABELS

    apart = enough(record) and enough(prose)
    return Calibration(judge=judge, whole_weight=weight, prose=fitted(prose if apart else list(range(len(parts)))),
                       records=fitted(record) if apart else None)


def fitted(items: list[Item], outcomes: list[Outcome], config: Config, *,
           recall: float = 0.75) -> dict[str, Any]:
    """The calibration of the configured check (`sentences` or `verifier`) from its outcomes on labelled `items`,
    with what it was fitted on and the thresholds it proposes."""
    name = check_detector(config)
    by_id = {o.item_id: o for o in outcomes if o.detector == name and o.error is None and o.repeat == 0}
    labelled = [(item, by_id[item.id]) for item in items if item.id in by_id]
    labels = [item.hallucinated for item, _ in labelled]
    if name == "verifier":
        result, probability = _verifier(labelled, labels, config)
    else:
        settings = config.section("sentences", SentencesSettings)
        found = calibration([o.features for _, o in labelled], labels, [item.task for item, _ in labelled],
                            judge_identity(config, settings.model))
        probability = {o.item_id: found.probability(o.features, o.features.get("record", 0.0) > 0,
                                                    settings.whole_weight)[0] for _, o in labelled}
        result = found.model_dump()
    rescored = [o.model_copy(update={"score": probability[o.item_id]}) for _, o in labelled]
    proposals = thresholds.propose([i for i, _ in labelled], rescored, name, config.policy, recall=recall)
    return {**result, "detector": name,
            "labels": {"answers": len(labels), "hallucinated": labels.count(True),
                       "about_records": sum(o.features.get("record", 0.0) > 0 for _, o in labelled),
                       "by_task": dict(Counter(item.task for item, _ in labelled))},
            "auroc": metrics.auroc(labels, [probability[o.item_id] for _, o in labelled]),
            "recall_target": recall, "thresholds": proposals}


def _verifier(labelled: list[tuple[Item, Outcome]], labels: list[bool],
              config: Config) -> tuple[dict[str, Any], dict[str, float]]:
    """A verifier's calibration (a logistic over its worst sentence's score) and the probabilities it makes."""
    if min(labels.count(True), labels.count(False)) < MIN_LABELS:
        raise MorphguardError(f"calibrating needs at least {MIN_LABELS} hallucinated and {MIN_LABELS} faithful "
                              f"answers checked; these have {labels.count(True)} and {labels.count(False)}")
    worst = {o.item_id: fused(o.features, 0.0) for _, o in labelled}  # no whole-answer verdict to weigh
    slope, intercept = fit.calibration([score_log_odds(worst[o.item_id]) for _, o in labelled], labels)
    probability = {i: calibrated(score, (slope, intercept)) for i, score in worst.items()}
    return ({"judge": verifier_identity(config.section("verifier", VerifierSettings).judged_by(config.judge)),
             "calibration": [slope, intercept]}, probability)


def write(result: dict[str, Any], path: Path) -> str:
    """Write the calibration; the config snippet that uses it."""
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    name = result["detector"]
    snippet = thresholds.snippet(result["thresholds"], name, f"recall ≥ {result['recall_target']}")
    return f"{name}:\n  calibration: {path}\n{snippet}"


def check_detector(config: Config) -> str:
    """The check calibrate fits for this config: `sentences` or `verifier`; MorphguardError for any other."""
    spec, _ = resolve(config)
    if spec.name not in CALIBRATED:
        raise MorphguardError(f"the configured judge runs the {spec.name} check, whose weights `morphguard eval --fit` "
                              "fits; calibrate fits the sentences check (detector.name: sentences, or auto with an API "
                              "judge) and the verifier check (auto with a trained verifier as judge.runtime)")
    return spec.name
