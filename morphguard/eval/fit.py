"""`morphguard eval --fit`: the combined check's weights, learned from labelled outcomes of its parts.

One logistic regression per channel of `detectors.combined.CHANNELS`, over standardised features, with
weights bounded at zero, its strength of regularisation chosen by cross-validation in folds of whole groups
(never two answers to one source on both sides of a fold). Fit on a fit half only: the report half is for reporting.

A channel learns from every answer that has its features: the judge's parts must have run for the channels
that read them, while the channel that needs no judge also learns from answers no judge has read
(`--fit-without-judge`). The contrast sets teach that channel nothing (`_teaches`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from morphguard.detectors.combined import (
    CHANNELS,
    JUDGE_FEATURES,
    PARTS,
    RECORD_ONLY,
    TUNING,
    UNJUDGED_CHANNELS,
    Channel,
    Weights,
    judged_values,
    read_text,
    reads,
)
from morphguard.detectors.logistic import log_odds
from morphguard.errors import MorphguardError
from morphguard.eval.items import Item
from morphguard.eval.runner import Outcome
from morphguard.models import RagInput

if TYPE_CHECKING:  # numpy, SciPy and scikit-learn come with the `eval` extra; only fitting needs them
    import numpy as np


def rows(items: Sequence[Item], outcomes: Sequence[Outcome], parts: Sequence[str] = PARTS,
         short_limit: int | None = None) -> tuple[list[dict[str, float]], list[bool], list[str], list[bool]]:
    """Features, labels and groups of every item all `parts` have scored (first repeat), and whether its context
    is short (up to `short_limit` characters: the check's `combined.tuned(...).short_context`, default the shipped
    weights'); with no parts, of every item, with the features that need no judge only."""
    limit = TUNING.short_context if short_limit is None else short_limit
    by_item: dict[str, dict[str, Outcome]] = defaultdict(dict)
    for o in outcomes:
        if o.repeat == 0 and o.error is None and o.detector in parts:
            by_item[o.item_id][o.detector] = o
    read = {f for p, f in zip(PARTS, JUDGE_FEATURES, strict=True) if p in parts}
    values, labels, groups, short = [], [], [], []
    for item in items:
        scored = by_item.get(item.id, {})
        if len(scored) < len(parts):
            continue
        evidence = read_text(RagInput(question=item.question, passages=item.passages), item.answer, limit)
        said = {f: scored[p].score or 0.0 for p, f in zip(PARTS, JUDGE_FEATURES, strict=True)
                if p in parts and p != "metarag:factoids"}
        if "metarag:factoids" in parts:
            said["factoid_max"] = max(scored["metarag:factoids"].factoid_scores, default=0.0)
        # with no parts, the features that need no judge (an answer that quotes its context is undoubted by none)
        values.append(judged_values(evidence, said, read))
        labels.append(item.hallucinated)
        groups.append(item.group or item.id)
        short.append(evidence.short)
    return values, labels, groups, short


def _teaches(channel: str, source: str) -> bool:
    """Whether answers from dataset `source` may teach `channel`. A contrast set's edits reuse the context's own
    words and it has no structured records, so what needs no judge is at chance there by construction: it
    could teach those channels only noise."""
    return channel not in UNJUDGED_CHANNELS or not source.startswith("contrast")


def fit(values: list[dict[str, float]], labels: list[bool], groups: list[str], about: dict[str, Any],
        sources: list[str] | None = None, channels: Mapping[str, Sequence[str]] = CHANNELS,
        teaches: Callable[[str, str], bool] | None = None, records_apart: bool = True,
        short: list[bool] | None = None) -> Weights:
    """Weights for `values` (one row of features per item; rows that lack the judge's features teach only the
    channels that need none). `sources` names each row's dataset: every dataset then weighs the same in each
    fit, so that a small one is not drowned by a larger one; within a dataset the classes keep the rates
    they have among all its rows (judged or not), so the probability stays calibrated to the mix. With
    `records_apart`, each channel learns only from the answers it reads at check time (`detectors.combined.reads`:
    the judge is not asked about an answer about a structured record, and the record's channel reads no
    prose), and the answers about records get a calibration of their own. `channels`, `teaches` and
    `records_apart` default to the shipped design; benchmarks/combined_designs.py compares others. `short` says
    whose context is short: those answers get a calibration of their own (`Weights.short_calibration`) where there
    are enough of them (`_calibrate`)."""
    sources = sources or [""] * len(labels)
    record = [records_apart and row.get("record_fields", 0.0) > 0 for row in values]
    judged = [i for i, row in enumerate(values) if any(f in row for f in JUDGE_FEATURES) and not record[i]]
    judged_labels = [labels[i] for i in judged]
    if (min(judged_labels.count(True), judged_labels.count(False)) < 5
            or len({groups[i] for i in judged}) < 2):
        raise MorphguardError("--fit needs at least 5 hallucinated and 5 faithful items, from two sources or more, "
                              f"scored by every judge part run (of {', '.join(PARTS)})"
                              + (" and not about a structured record" if any(record) else ""))

    teaches = teaches or _teaches
    rates = {source: _rate(labels, sources, source) for source in set(sources)}

    def share(rows: list[int]) -> np.ndarray:
        return _representative([sources[i] for i in rows], [labels[i] for i in rows], rates)

    fitted, strengths = {}, {}
    for name, wanted in channels.items():
        names = [f for f in wanted if f in values[judged[0]]]
        if not names:
            continue  # a channel of parts that did not run: the weights leave it out, and the check never asks them
        taught = [i for i, row in enumerate(values) if all(f in row for f in names) and teaches(name, sources[i])
                  and reads(name, record[i], records_apart)]
        if name in RECORD_ONLY and len({labels[i] for i in taught}) < 2:
            continue  # no answers about records to learn from (both kinds): the weights leave records to prose's
        if not all(any(labels[i] == kind for i in taught) for kind in (True, False)) or \
                len({groups[i] for i in taught}) < 2:
            raise MorphguardError(f"--fit: the {name} channel has no hallucinated or no faithful answers, from two "
                                  "sources or more, to learn from (contrast sets do not teach the invented channel); "
                                  "add a dataset such as ragtruth-qa, or more with --fit-without-judge")
        fitted[name], strengths[name] = _channel(names, [values[i] for i in taught], [labels[i] for i in taught],
                                                 [groups[i] for i in taught], share(taught))
    joint = Weights(channels=fitted, record_calibration=(1.0, 0.0) if records_apart else None)  # slopes come next
    short = short or [False] * len(labels)
    calibrated, _ = _calibrate(joint, values, labels, record, short, share)
    about_records = [i for i in range(len(values)) if record[i]]
    return calibrated.model_copy(update={"fitted_on": {
        **about, "items": len(judged), "hallucinated": judged_labels.count(True),
        "items_without_judge": len(values) - len(judged),
        "hallucinated_without_judge": labels.count(True) - judged_labels.count(True),
        "items_about_records": len(about_records), "hallucinated_about_records": sum(labels[i] for i in about_records),
        "items_over_short_context": sum(short[i] for i in judged), "C": strengths}})


def recalibrate(weights: Weights, values: list[dict[str, float]], labels: list[bool], about: dict[str, Any],
                sources: list[str] | None = None, short: list[bool] | None = None) -> Weights:
    """`weights` with their channels as they are and their calibrations fitted anew on `values` (`eval --fit
    --recalibrate`): each calibration the data has enough answers for (`_calibrate`), the others kept. Two numbers
    per calibration rather than a dozen per fit, so a few dozen labelled answers of one's own (a fair sample of what
    the check reads, not flagged answers alone) can move where a threshold falls without teaching the channels their
    noise."""
    sources = sources or [""] * len(labels)
    short = short or [False] * len(labels)
    rates = {source: _rate(labels, sources, source) for source in set(sources)}
    calibrated, which = _calibrate(
        weights, values, labels, [weights.reads_record(row) for row in values], short,
        lambda rows: _representative([sources[i] for i in rows], [labels[i] for i in rows], rates), keep=weights)
    if not which:
        raise MorphguardError(f"--recalibrate needs at least {MIN_CALIBRATION} hallucinated and {MIN_CALIBRATION} "
                              "faithful answers of one kind (over a long context, over a short one, or about a "
                              "record), scored by every judge part the weights read")
    return calibrated.model_copy(update={"fitted_on": {**weights.fitted_on, "recalibrated": {
        **about, "calibrations": which, "items": len(labels), "hallucinated": sum(labels),
        "items_over_short_context": sum(short)}}})


MIN_CALIBRATION = 5  # fewest answers of each label a calibration learns from where another could stand in


def _calibrate(joint: Weights, values: list[dict[str, float]], labels: list[bool], record: list[bool],
               short: list[bool], share: Callable[[list[int]], np.ndarray], keep: Weights | None = None
               ) -> tuple[Weights, list[str]]:
    """`joint` with its calibrations fitted, each a logistic over the noisy-OR's log-odds of its own answers, and
    the names of those fitted. The records' on every answer about one; the short contexts' on the answers over one
    that every part has read, if there are `MIN_CALIBRATION` of each label; the default on the others every part
    has read (on all of those if the long contexts are too few). Where there are too few answers for one
    calibration, `keep`'s stands; without `keep` the records' and short contexts' are then left out (they fall back
    on the default) and the default is fitted on what there is."""
    def enough(rows: list[int]) -> bool:
        return min(sum(labels[i] for i in rows), sum(not labels[i] for i in rows)) >= MIN_CALIBRATION

    def fitted(rows: list[int], about_record: bool = False) -> tuple[float, float]:
        return _calibration([log_odds(joint.either(values[i], record=about_record)) for i in rows],
                            [labels[i] for i in rows], share(rows))

    read = [i for i in range(len(values)) if not record[i] and joint.features <= values[i].keys()]
    longer, over_short = [i for i in read if not short[i]], [i for i in read if short[i]]
    about_records = [i for i in range(len(values)) if record[i]]
    can_read_records = set(RECORD_ONLY) <= joint.channels.keys() and len({labels[i] for i in about_records}) == 2
    found = {
        "calibration": (fitted(longer) if enough(longer) else fitted(read) if keep is None else None),
        "record_calibration": (fitted(about_records, about_record=True)
                               if can_read_records and (keep is None or enough(about_records)) else None),
        "short_calibration": fitted(over_short) if enough(over_short) else None,
    }
    kept = keep or Weights(channels=joint.channels)
    return (joint.model_copy(update={name: value if value is not None else getattr(kept, name)
                                     for name, value in found.items()}),
            [name for name, value in found.items() if value is not None])


def logistic(values: list[dict[str, float]], names: Sequence[str], labels: list[bool],
             sources: list[str]) -> tuple[dict[str, float], float]:
    """A logistic over the `names` of `values`, weights not negative (`_logistic`) and not shrunk, every source
    weighing the same (`_representative`): its weights in the values' own units, and its intercept (the `sentences`
    check's calibrations, `morphguard calibrate`)."""
    import numpy as np

    matrix = np.array([[row[n] for n in names] for row in values], dtype=float)
    mean, scale = matrix.mean(axis=0), matrix.std(axis=0)
    scale[scale == 0] = 1.0
    rates = {source: _rate(labels, sources, source) for source in set(sources)}
    w, b = _logistic((matrix - mean) / scale, np.array(labels, dtype=float), 1e6,
                     _representative(sources, labels, rates))
    coef = w / scale
    return {n: float(c) for n, c in zip(names, coef, strict=True)}, float(b - coef @ mean)


def calibration(log_odds_: list[float], labels: list[bool]) -> tuple[float, float]:
    """Slope and intercept of one logistic over `log_odds_`, every row weighing the same (a verifier's calibration,
    `morphguard calibrate`)."""
    import numpy as np

    return _calibration(log_odds_, labels, np.ones(len(labels)))


def _calibration(log_odds_: list[float], labels: list[bool], weight: np.ndarray) -> tuple[float, float]:
    """Slope and intercept of one logistic over the noisy-OR's log-odds."""
    import numpy as np

    slope, intercept = _logistic(np.array([[v] for v in log_odds_]), np.array(labels, dtype=float), 1e6,  # no shrinking
                                 weight)
    return float(slope[0]), intercept


def _channel(names: list[str], values: list[dict[str, float]], labels: list[bool], groups: list[str],
             weight: np.ndarray) -> tuple[Channel, float]:
    import numpy as np

    matrix = np.array([[row[n] for n in names] for row in values], dtype=float)
    mean = matrix.mean(axis=0)
    scale = matrix.std(axis=0)
    scale[scale == 0] = 1.0
    x, y = (matrix - mean) / scale, np.array(labels, dtype=float)
    c = _choose_c(x, y, groups, weight)
    coef, intercept = _logistic(x, y, c, weight)
    return Channel(features=names, mean=[float(v) for v in mean], scale=[float(v) for v in scale],
                   coef=[float(v) for v in coef], intercept=intercept), c


def _logistic(x: np.ndarray, y: np.ndarray, c: float, weight: np.ndarray | None = None) -> tuple[np.ndarray, float]:
    """L2-regularised logistic regression whose weights may not be negative.

    Every feature is a risk signal (more unsupported words, a surer NO, a copied sentence changed): a
    negative weight would make an answer look safer for showing a warning sign, which is a fit to noise
    or to features that move together. Bounding the weights at zero keeps each signal or switches it
    off, and keeps the others as they are; the intercept is free."""
    import numpy as np
    from scipy.optimize import minimize

    def loss(params: np.ndarray) -> tuple[float, np.ndarray]:
        w, b = params[:-1], params[-1]
        z = x @ w + b
        p = 1.0 / (1.0 + np.exp(-z))
        value = float(np.sum(sample * (np.logaddexp(0.0, z) - y * z)) + w @ w / (2 * c))
        residual = sample * (p - y)
        return value, np.append(x.T @ residual + w / c, residual.sum())

    sample = np.ones(len(y)) if weight is None else weight
    start = np.zeros(x.shape[1] + 1)
    bounds = [(0.0, None)] * x.shape[1] + [(None, None)]
    found = minimize(loss, start, jac=True, method="L-BFGS-B", bounds=bounds)
    return found.x[:-1], float(found.x[-1])


def _rate(labels: list[bool], sources: list[str], source: str) -> float:
    mine = [y for y, s in zip(labels, sources, strict=True) if s == source]
    return sum(mine) / len(mine)


def _representative(sources: list[str], labels: list[bool], rates: dict[str, float]) -> np.ndarray:
    """Sample weights: every dataset weighs the same, and within one the hallucinated answers weigh as much as
    they do among all of that dataset's rows. A judged sample stratified by label (half hallucinated) of a half
    whose other answers joined unjudged would otherwise teach the judge's channels and the calibration an
    error rate the data does not have (RAGTruth Summary's fit half: 25 %)."""
    import numpy as np

    weight = np.ones(len(sources))
    for source in set(sources):
        mine = [i for i, s in enumerate(sources) if s == source]
        here = sum(labels[i] for i in mine) / len(mine)
        for i in mine:
            if 0 < here < 1:
                weight[i] = rates[source] / here if labels[i] else (1 - rates[source]) / (1 - here)
        weight[mine] *= len(sources) / (len(set(sources)) * weight[mine].sum())
    return weight


def _choose_c(x: np.ndarray, y: np.ndarray, groups: list[str], weight: np.ndarray) -> float:
    """The regularisation strength with the lowest log-loss over folds of whole groups."""
    import numpy as np
    from sklearn.model_selection import GroupKFold

    folds = list(GroupKFold(n_splits=min(5, len(set(groups)))).split(x, y, groups))
    best: tuple[float, float] | None = None
    for c in np.logspace(-3, 2, 11):
        total = 0.0
        for train, test in folds:
            w, b = _logistic(x[train], y[train], float(c), weight[train])
            z = x[test] @ w + b
            total += float(np.sum(weight[test] * (np.logaddexp(0.0, z) - y[test] * z)))
        if best is None or total < best[0]:
            best = (total, float(c))
    assert best is not None
    return best[1]
