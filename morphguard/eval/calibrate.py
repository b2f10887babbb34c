"""`morphguard calibrate`: the `sentences` check's numbers for the judge a team runs, or the `verifier` check's for
its model, from answers labelled right or wrong (the datasets `eval` knows, a JSONL file of the team's own, the review
console's judgements).

From the labelled answers alone: for `sentences`, the whole-answer verdict's weight (the one of
`benchmarks/judge_quality.py --weigh`'s grid with the best AUROC); for both, a logistic calibration that turns the
score into a probability, and per-topic thresholds at a target recall over those probabilities. They are written
to a file with the judge or model they were fitted with; `sentences.calibration` or `verifier.calibration` names the
file, and a check with another judge or model warns that it does not fit. The combined check's weights are fitted by
`morphguard eval --fit` instead.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from morphguard.config import Config, VerifierSettings
from morphguard.detectors import resolve
from morphguard.detectors.judges import judge_identity
from morphguard.detectors.sentences import SentencesSettings, calibrated, fused, score_log_odds
from morphguard.detectors.verifier import identity as verifier_identity
from morphguard.errors import MorphguardError
from morphguard.eval import fit, metrics, thresholds
from morphguard.eval.items import Item
from morphguard.eval.runner import Outcome

WEIGHTS = (0.0, 0.25, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
MIN_LABELS = 5
CALIBRATED = ("sentences", "verifier")  # of each kind, below which a calibration says nothing


def fitted(items: list[Item], outcomes: list[Outcome], config: Config, *,
           recall: float = 0.75) -> dict[str, Any]:
    """The calibration of the configured check (`sentences` or `verifier`) from its outcomes on labelled `items`."""
    name = check_detector(config)
    by_id = {o.item_id: o for o in outcomes if o.detector == name and o.error is None and o.repeat == 0}
    labelled = [(item, by_id[item.id]) for item in items if item.id in by_id]
    labels = [item.hallucinated for item, _ in labelled]
    if min(labels.count(True), labels.count(False)) < MIN_LABELS:
        raise MorphguardError(f"calibrating needs at least {MIN_LABELS} hallucinated and {MIN_LABELS} faithful "
                              f"answers checked; these have {labels.count(True)} and {labels.count(False)}")

    def auroc(weight: float) -> float:
        return metrics.auroc(labels, [fused(o.features, weight) for _, o in labelled]) or 0.0

    # a verifier's score is its worst sentence's: no whole-answer verdict to weigh
    weight = max(WEIGHTS, key=lambda w: (auroc(w), -abs(w - 0.6))) if name == "sentences" else 0.0
    slope, intercept = fit.calibration([score_log_odds(fused(o.features, weight)) for _, o in labelled], labels)
    probability = {o.item_id: calibrated(fused(o.features, weight), (slope, intercept)) for _, o in labelled}
    rescored = [o.model_copy(update={"score": probability[o.item_id]}) for _, o in labelled]
    proposals = thresholds.propose([i for i, _ in labelled], rescored, name, config.policy, recall=recall)
    if name == "sentences":
        fitted_with = {"judge": judge_identity(config, config.section(name, SentencesSettings).model),
                       "whole_weight": weight}
    else:
        fitted_with = {"judge": verifier_identity(config.section(name, VerifierSettings))}
    return {**fitted_with, "detector": name, "calibration": [slope, intercept],
            "labels": {"answers": len(labels), "hallucinated": labels.count(True),
                       "by_task": dict(Counter(item.task for item, _ in labelled))},
            "auroc": auroc(weight), "recall_target": recall, "thresholds": proposals}


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
                              "judge) and the verifier check (auto with verifier.model set)")
    return spec.name
