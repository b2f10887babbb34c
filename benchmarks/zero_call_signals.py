"""How well each of grounding's features ranks the fit halves' answers on its own: AUROC, no judge, seconds.

A feature worth a place in the combined check's channels should rank some task's answers better than what those channels
already read (`unsupported` and its numbers and names) or than the answer's length. Beside each feature alone: the
invented channel's inputs (`combined.vocabulary_features`: the unsupported words, numbers and names), fitted as `eval
--fit` fits that channel, with and without a candidate (`CANDIDATES`: signals computed here, not by the check, until one
earns a place), by grouped 5-fold cross-validation within the set (folds of whole sources, so one source's answers by
several models stay together). Run on the fit halves only, so that a feature is chosen without reading the report
halves. Answers about records (Data2txt) are not in the default list: the combined check reads them by their fields.
Prints a table per set and writes benchmarks/results/zero_call_signals.json.

    python benchmarks/zero_call_signals.py [--half fit] [--datasets ragtruth-qa,ragtruth-summary,halueval]
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from pathlib import Path

from morphguard.detectors.alignment import Context
from morphguard.detectors.combined import CHANNELS, vocabulary_features
from morphguard.detectors.grounding import Grounding, GroundingSettings
from morphguard.detectors.text import sentences, statements
from morphguard.eval import datasets, fit, metrics
from morphguard.models import RagInput

HERE = Path(__file__).resolve().parent
LABELLED = ("ragtruth-qa", "ragtruth-summary", "halueval")
SHOWN = ("unsupported", "unsupported_share", "worst_sentence_share", "content_words")


def unanchored(answer: str, passages: list[str]) -> float:
    """How far the answer's stating sentences stray from any one context sentence: the mean, over them, of the weighted
    share of a sentence's content that the context sentence it copies most does not hold (1 for a sentence sharing no
    content word). A faithful sentence mostly restates one context sentence; one that adds a claim, or joins words the
    context uses apart, is held by none. No design of the combined check gave it weight
    (benchmarks/combined_designs.py), so the check does not compute it."""
    context = Context(passages)
    shares = []
    for start, end in sentences(answer):
        if statements(answer[start:end]):
            match = context.copied(answer[start:end])
            shares.append(1.0 - (match[1] if match else 0.0))
    return math.fsum(shares) / len(shares) if shares else 0.0


# Candidate signals, tried in the invented channel one at a time: name -> f(answer, passages).
CANDIDATES: dict[str, Callable[[str, list[str]], float]] = {"unanchored": unanchored}


def rank(items: list[datasets.Item]) -> dict[str, float | None]:
    """Each feature's AUROC over `items`, the answer length's (words) beside them, and the invented channel's
    cross-validated AUROC without and with each of `CANDIDATES`."""
    grounding = Grounding(GroundingSettings())
    labels = [item.hallucinated for item in items]
    found = [grounding.measure(RagInput(question=item.question, passages=list(item.passages)), item.answer).features
             for item in items]
    for name, signal in CANDIDATES.items():
        for f, item in zip(found, items, strict=True):
            f[name] = signal(item.answer, list(item.passages))
    out = {name: metrics.auroc(labels, [f[name] for f in found]) for name in (*SHOWN, *CANDIDATES)}
    out["length"] = metrics.auroc(labels, [float(len(item.answer.split())) for item in items])
    inputs = [vocabulary_features(f) | {c: f[c] for c in CANDIDATES} for f in found]
    groups = [item.group or item.id for item in items]
    for extra in ((), *((c,) for c in CANDIDATES)):
        columns = [*CHANNELS["invented"], *extra]
        out["invented channel" + "".join(f" + {c}" for c in extra)] = _cross_validated(columns, inputs, labels, groups)
    return out


def _cross_validated(columns: list[str], inputs: list[dict[str, float]], labels: list[bool], groups: list[str]
                     ) -> float | None:
    """The AUROC of out-of-fold probabilities of one channel over `columns`, fitted as `eval --fit` fits a channel
    (weights bounded at zero, the regularisation chosen in folds of whole groups), in grouped 5-fold CV."""
    import numpy as np
    from sklearn.model_selection import GroupKFold

    scores = [0.0] * len(labels)
    for train, test in GroupKFold(5).split(inputs, labels, groups):
        channel, _ = fit._channel(columns, [inputs[i] for i in train], [labels[i] for i in train],
                                  [groups[i] for i in train], np.ones(len(train)))
        for i in test:
            scores[i] = channel.probability(inputs[i])
    return metrics.auroc(labels, scores)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--half", default="fit")
    parser.add_argument("--datasets", default=",".join(LABELLED))
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "zero_call_signals.json")
    args = parser.parse_args()
    results = {}
    for name in args.datasets.split(","):
        items = datasets.load_half(name, args.half, args.data_dir)
        ranked = rank(items)
        results[name] = {"answers": len(items), "hallucinated": sum(i.hallucinated for i in items), **ranked}
        print(f"{name} ({args.half} half, {len(items)} answers, {results[name]['hallucinated']} hallucinated): AUROC")
        for feature, auroc in ranked.items():
            print(f"  {feature:22s} {'–' if auroc is None else f'{auroc:.3f}'}")
    args.out.write_text(json.dumps({"half": args.half, "sets": results}, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
