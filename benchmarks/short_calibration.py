"""Whether answers over a short context are better read with a calibration of their own, set by set out of sample.

For each short-context fit half in turn, the short contexts' calibration (`Weights.short_calibration`) is fitted by
`fit.recalibrate` on the other sets' answers, the channels kept as shipped, and the held-out set is read twice: with
the long contexts' calibration (as if short contexts had none of their own) and with the one learnt elsewhere. Figures:
F1, precision and recall at the general and the sensitive threshold, AUROC, and the expected calibration error.
Both profiles: the default (every part asked, as over a short context) and `fast` (no `direct`). Reads the judge
parts' stored outcomes of finished runs (nothing calls the judge):

    morphguard eval -d halueval,contrast-brief-qa,contrast-brief-summary --half fit --limit 300,all,all \
        --detector direct,restatement,spotcheck
    python benchmarks/short_calibration.py

The shipped calibrations were fitted on all three sets (`eval --fit --recalibrate`), so only these held-out rows
say how well a calibration carries to a set it has not seen.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from morphguard.config import Config
from morphguard.detectors import fingerprint
from morphguard.detectors.combined import (
    TUNING,
    Weights,
    answer_probability,
    load_weights,
    short_changed_copy,
)
from morphguard.detectors.grounding import Grounding, GroundingSettings
from morphguard.eval import datasets, fit, metrics, runner
from morphguard.models import RagInput

SETS = {"halueval": 300, "contrast-brief-qa": None, "contrast-brief-summary": None}  # the fit-half samples read
THRESHOLDS = (0.3, 0.175)  # the default policy's general and sensitive thresholds (config.py)


def _rows(runs: Path, dataset: str, limit: int | None, parts: list[str]) -> list[tuple[dict, dict, bool, bool]]:
    """(features, grounding's features, changed copy, label) of every answer all `parts` have scored, over a short
    context only (those the short contexts' calibration reads)."""
    items = datasets.sample(datasets.load_half(dataset, "fit"), limit)
    folder = runs / f"{dataset}-fit-n{len(items)}-seed0"
    if not folder.exists():
        raise SystemExit(f"no run folder {folder}: run the eval in the docstring first")
    current = {part: fingerprint(Config(), part) for part in parts}
    outcomes = [o for o in runner.load_outcomes(folder) if o.fingerprint == current.get(o.detector)]
    grounding = Grounding(GroundingSettings())
    out = []
    for item in items:
        values, labels, _, short = fit.rows([item], outcomes, parts)
        if values and short[0]:
            grounded = grounding.measure(RagInput(question=item.question, passages=item.passages), item.answer)
            out.append((values[0], grounded.features, short_changed_copy(item.answer, grounded.features), labels[0]))
    return out


def _figures(weights: Weights, rows: list[tuple[dict, dict, bool, bool]]) -> dict[str, float | None]:
    scores = [answer_probability(weights, v, g, copy, short=True) for v, g, copy, _ in rows]
    labels = [y for *_, y in rows]
    figures: dict[str, float | None] = {"auroc": metrics.auroc(labels, scores),
                                        "ece": metrics.calibration_error(labels, scores)}
    for tau in THRESHOLDS:
        binary = metrics.confusion(labels, [s >= tau for s in scores]).as_dict()
        figures |= {f"{k}@{tau}": binary[k] for k in ("f1", "precision", "recall")}
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=Path("runs/eval"))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/short_calibration.json"))
    args = parser.parse_args()
    results: dict[str, dict] = {}
    for profile, parts in (("", ["direct", "restatement", "spotcheck"]), ("fast", ["restatement", "spotcheck"])):
        shipped = load_weights(None, profile)
        long_only = shipped.model_copy(update={"short_calibration": None})
        rows = {dataset: _rows(args.runs, dataset, limit, parts) for dataset, limit in SETS.items()}
        for held_out in SETS:
            others = [r for dataset, r in rows.items() if dataset != held_out for r in r]
            learnt = fit.recalibrate(long_only, [v for v, *_ in others], [y for *_, y in others], {},
                                     [d for d, r in rows.items() if d != held_out for _ in r],
                                     [True] * len(others))
            results[f"{profile or 'default'} / {held_out}"] = {
                "n": len(rows[held_out]), "hallucinated": sum(y for *_, y in rows[held_out]),
                "short_calibration": learnt.short_calibration,
                "long contexts' calibration": _figures(long_only, rows[held_out]),
                "learnt on the other sets": _figures(learnt, rows[held_out])}
    args.out.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(f"held-out short-context fit halves (contexts of at most {TUNING.short_context} characters); "
          f"wrote {args.out}")
    print(f"{'profile / held-out set':38s} {'n':>4s}  {'calibration':28s} " + " ".join(
        f"{'F1@' + str(t):>8s} {'P':>5s} {'R':>5s}" for t in THRESHOLDS) + f" {'AUROC':>6s} {'ECE':>6s}")
    for name, result in results.items():
        for reading in ("long contexts' calibration", "learnt on the other sets"):
            f = result[reading]
            print(f"{name:38s} {result['n']:4d}  {reading:28s} " + " ".join(
                f"{f[f'f1@{t}']:8.3f} {f[f'precision@{t}']:5.2f} {f[f'recall@{t}']:5.2f}" for t in THRESHOLDS)
                + f" {f['auroc']:6.3f} {f['ece']:6.3f}")


if __name__ == "__main__":
    main()
