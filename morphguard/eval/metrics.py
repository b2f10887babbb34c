"""Detection quality from labels and scores: P/R/F1/accuracy at a threshold, AUROC, PR-AUC,
span-level precision/recall/F1 by character overlap, and the threshold that maximises F1.

Pure functions over plain lists; labels are True for hallucinated.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

Spans = Sequence[tuple[int, int]]


@dataclass(frozen=True)
class Binary:
    tp: int
    fp: int
    fn: int
    tn: int

    @property
    def precision(self) -> float | None:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else None

    @property
    def recall(self) -> float | None:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else None

    @property
    def f1(self) -> float | None:
        return _f1(self.tp, self.fp, self.fn)

    @property
    def accuracy(self) -> float | None:
        total = self.tp + self.fp + self.fn + self.tn
        return (self.tp + self.tn) / total if total else None

    def as_dict(self) -> dict[str, float | int | None]:
        return {**asdict(self), "precision": self.precision, "recall": self.recall, "f1": self.f1,
                "accuracy": self.accuracy}


def _f1(tp: float, fp: float, fn: float) -> float | None:
    """F1 = 2TP / (2TP + FP + FN); None when there is nothing to find and nothing was predicted."""
    return 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else None


def confusion(labels: Sequence[bool], flagged: Sequence[bool]) -> Binary:
    pairs = list(zip(labels, flagged, strict=True))
    return Binary(tp=sum(y and p for y, p in pairs), fp=sum(p and not y for y, p in pairs),
                  fn=sum(y and not p for y, p in pairs), tn=sum(not y and not p for y, p in pairs))


def at_threshold(labels: Sequence[bool], scores: Sequence[float], threshold: float) -> Binary:
    return confusion(labels, [s >= threshold for s in scores])


def auroc(labels: Sequence[bool], scores: Sequence[float]) -> float | None:
    """P(score of a hallucinated answer > score of a faithful one), ties counting half; None if one class.

    Computed from ranks (Mann-Whitney U), so the bootstrap below can afford a thousand rounds."""
    positives = sum(1 for y in labels if y)
    negatives = len(labels) - positives
    if not positives or not negatives:
        return None
    order = sorted(range(len(scores)), key=lambda i: scores[i])
    rank_sum, at = 0.0, 0
    while at < len(order):  # tied scores share the mean of their ranks
        end = at
        while end + 1 < len(order) and scores[order[end + 1]] == scores[order[at]]:
            end += 1
        mean_rank = (at + end) / 2 + 1
        rank_sum += mean_rank * sum(1 for i in order[at:end + 1] if labels[i])
        at = end + 1
    return (rank_sum - positives * (positives + 1) / 2) / (positives * negatives)


def calibration_error(labels: Sequence[bool], scores: Sequence[float], bins: int = 10) -> float | None:
    """Expected calibration error: how far scores read as probabilities are from the observed rates, averaged
    over equal-width score bins weighted by their size (0 = a score of 0.3 means 30 % are hallucinated)."""
    if not labels:
        return None
    total = 0.0
    for b in range(bins):
        members = [i for i, s in enumerate(scores) if min(int(s * bins), bins - 1) == b]
        if members:
            rate = sum(labels[i] for i in members) / len(members)
            mean = sum(scores[i] for i in members) / len(members)
            total += len(members) * abs(rate - mean)
    return total / len(labels)


def auroc_interval(labels: Sequence[bool], scores: Sequence[float], rounds: int = 1000, level: float = 0.95,
                   seed: int = 0) -> tuple[float, float] | None:
    """A percentile bootstrap interval for the AUROC (items resampled with replacement)."""
    if auroc(labels, scores) is None:
        return None
    rng = random.Random(seed)
    n = len(labels)
    values = []
    for _ in range(rounds):
        picks = [rng.randrange(n) for _ in range(n)]
        value = auroc([labels[i] for i in picks], [scores[i] for i in picks])
        if value is not None:
            values.append(value)
    values.sort()
    tail = (1 - level) / 2
    return values[int(tail * (len(values) - 1))], values[int((1 - tail) * (len(values) - 1))]


def pr_auc(labels: Sequence[bool], scores: Sequence[float]) -> float | None:
    """Average precision: Σ (Rₖ − Rₖ₋₁)·Pₖ over the distinct score thresholds, highest first."""
    total_positive = sum(labels)
    if not total_positive:
        return None
    area, tp, fp, last_recall = 0.0, 0, 0, 0.0
    for threshold in sorted(set(scores), reverse=True):
        tp += sum(1 for y, s in zip(labels, scores, strict=True) if s == threshold and y)
        fp += sum(1 for y, s in zip(labels, scores, strict=True) if s == threshold and not y)
        recall = tp / total_positive
        area += (recall - last_recall) * (tp / (tp + fp))
        last_recall = recall
    return area


def roc_points(labels: Sequence[bool], scores: Sequence[float]) -> list[tuple[float, float]]:
    """(false positive rate, true positive rate) from the strictest threshold to the loosest."""
    positives, negatives = sum(labels), len(labels) - sum(labels)
    points = [(0.0, 0.0)]
    for threshold in sorted(set(scores), reverse=True):
        b = at_threshold(labels, scores, threshold)
        points.append((b.fp / negatives if negatives else 0.0, b.tp / positives if positives else 0.0))
    return points


def pr_points(labels: Sequence[bool], scores: Sequence[float]) -> list[tuple[float, float]]:
    """(recall, precision) for every distinct threshold, highest first."""
    points = []
    for threshold in sorted(set(scores), reverse=True):
        b = at_threshold(labels, scores, threshold)
        points.append((b.recall or 0.0, b.precision or 0.0))
    return points


def best_threshold(labels: Sequence[bool], scores: Sequence[float]) -> float:
    """The threshold with the highest F1 (flagged when score ≥ τ); among ties the highest τ, the fewest alarms."""
    best_f1, best_tau = -1.0, 0.5
    for threshold in sorted(set(scores), reverse=True):
        f1 = at_threshold(labels, scores, threshold).f1 or 0.0
        if f1 > best_f1:
            best_f1, best_tau = f1, threshold
    return best_tau


def _characters(spans: Spans) -> set[int]:
    return {i for start, end in spans for i in range(start, end)}


@dataclass(frozen=True)
class SpanScores:
    """Micro-averaged over all answers: characters predicted, gold, and in both."""

    predicted: int
    gold: int
    overlap: int

    @property
    def precision(self) -> float | None:
        return self.overlap / self.predicted if self.predicted else None

    @property
    def recall(self) -> float | None:
        return self.overlap / self.gold if self.gold else None

    @property
    def f1(self) -> float | None:
        return _f1(self.overlap, self.predicted - self.overlap, self.gold - self.overlap)

    def as_dict(self) -> dict[str, float | int | None]:
        return {**asdict(self), "precision": self.precision, "recall": self.recall, "f1": self.f1}


def span_scores(gold: Iterable[Spans], predicted: Iterable[Spans]) -> SpanScores:
    """Character-overlap span scores (the RAGTruth protocol); overlapping spans count each character once."""
    predicted_total = gold_total = overlap = 0
    for gold_spans, predicted_spans in zip(gold, predicted, strict=True):
        g, p = _characters(gold_spans), _characters(predicted_spans)
        predicted_total += len(p)
        gold_total += len(g)
        overlap += len(g & p)
    return SpanScores(predicted=predicted_total, gold=gold_total, overlap=overlap)


def spread(values: Iterable[float | None]) -> dict[str, float | None]:
    """Mean and sample standard deviation over repeats, ignoring undefined values."""
    present = [v for v in values if v is not None]
    return {"mean": statistics.fmean(present) if present else None,
            "std": statistics.stdev(present) if len(present) > 1 else None}
