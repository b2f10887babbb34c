"""`morphguard eval --fit`: the combined check's weights, learned from labelled outcomes of its parts.

A logistic regression over the features of `detectors.combined.features`, standardised, its strength of
regularisation chosen by cross-validation in folds of whole groups (never two answers to one source on
both sides of a fold). Fit on a fit half only: the report half is for reporting.
"""

from __future__ import annotations

import asyncio
import warnings
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from morphguard.detectors.combined import PARTS, Weights, features
from morphguard.detectors.grounding import Grounding, GroundingSettings
from morphguard.errors import MorphguardError
from morphguard.eval.datasets import Item
from morphguard.eval.runner import Outcome
from morphguard.models import RagInput


def rows(items: Sequence[Item], outcomes: Sequence[Outcome], parts: Sequence[str] = PARTS
         ) -> tuple[list[dict[str, float]], list[bool], list[str]]:
    """Features, labels and groups of every item all `parts` have scored (first repeat)."""
    by_item: dict[str, dict[str, Outcome]] = defaultdict(dict)
    for o in outcomes:
        if o.repeat == 0 and o.error is None and o.detector in parts:
            by_item[o.item_id][o.detector] = o
    grounding = Grounding(GroundingSettings())
    values, labels, groups = [], [], []
    for item in items:
        scored = by_item.get(item.id, {})
        if len(scored) < len(parts):
            continue
        grounded = asyncio.run(grounding.detect(RagInput(question=item.question, passages=item.passages),
                                                item.answer))
        factoids = scored["metarag:factoids"].factoid_scores if "metarag:factoids" in parts else None
        values.append(features(scored["direct"].score or 0.0, factoids, grounded.features))
        labels.append(item.hallucinated)
        groups.append(item.group or item.id)
    return values, labels, groups


def fit(values: list[dict[str, float]], labels: list[bool], groups: list[str], about: dict[str, Any]) -> Weights:
    if min(labels.count(True), labels.count(False)) < 5 or len(set(groups)) < 2:
        raise MorphguardError("--fit needs at least 5 hallucinated and 5 faithful items, from two sources or more, "
                              f"scored by every part ({', '.join(PARTS)})")
    names = list(values[0])
    # Every feature is a risk signal: more unsupported words, a surer NO, more copied sentences changed. A
    # negative weight is a fit to noise or to two features that move together, and it would make an answer
    # look safer for having more of a warning sign; such features are dropped, one at a time, and refitted.
    while True:
        model, scaler = _fit(names, values, labels, groups)
        worst = min(range(len(names)), key=lambda i: model.coef_[0][i])
        if model.coef_[0][worst] >= 0 or len(names) == 1:
            break
        names = names[:worst] + names[worst + 1:]
    return Weights(features=names, mean=list(map(float, scaler.mean_)), scale=list(map(float, scaler.scale_)),
                   coef=[float(c) for c in model.coef_[0]], intercept=float(model.intercept_[0]),
                   fitted_on={**about, "items": len(labels), "hallucinated": labels.count(True),
                              "C": float(model.C_[0])})


def _fit(names: list[str], values: list[dict[str, float]], labels: list[bool], groups: list[str]) -> Any:
    from sklearn.linear_model import LogisticRegressionCV
    from sklearn.model_selection import GroupKFold
    from sklearn.preprocessing import StandardScaler

    matrix = [[row[n] for n in names] for row in values]
    scaler = StandardScaler().fit(matrix)
    folds = list(GroupKFold(n_splits=min(5, len(set(groups)))).split(matrix, labels, groups))
    model = LogisticRegressionCV(Cs=10, cv=folds, scoring="neg_log_loss", max_iter=2000)
    with warnings.catch_warnings():  # scikit-learn 1.9 announces a change of attributes we do not read
        warnings.simplefilter("ignore", FutureWarning)
        model.fit(scaler.transform(matrix), labels)
    return model, scaler
