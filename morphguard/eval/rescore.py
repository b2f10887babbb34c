"""`morphguard eval --rescore`: the combined check scored anew from a finished run, without the judge.

The combined check's outcome keeps its judge parts' scores among its features (`direct`, `restatement`,
`factoid_max`), and grounding costs nothing to recompute from the item. A new weights file (a refit, say on
reviewed production decisions) can therefore be read on a finished run exactly as a fresh run would read it
with the same judge replies: this writes those outcomes under the current fingerprint, so the report that
follows is the new weights'. Cost and time are the stored run's, since the same parts ran.
"""

from __future__ import annotations

from collections.abc import Sequence

from morphguard.detectors.combined import Weights, answer_probability, features
from morphguard.detectors.grounding import Grounding, GroundingSettings
from morphguard.eval.datasets import Item
from morphguard.eval.runner import Outcome, ScoredSpan
from morphguard.models import RagInput

JUDGED = ("direct", "restatement", "factoid_max")  # the judge parts' scores, as `features` names them


def rescore(items: Sequence[Item], stored: Sequence[Outcome], weights: Weights, fingerprint: str,
            threshold: float) -> list[Outcome]:
    """New `combined` outcomes for every stored one made under another fingerprint whose judge scores cover
    what `weights` needs; items that already have a current outcome are left alone."""
    by_id = {i.id: i for i in items}
    current = {o.key for o in stored if o.detector == "combined" and o.fingerprint == fingerprint}
    needed = [f for f in JUDGED if f in weights.features]
    grounding = Grounding(GroundingSettings())
    fresh: dict[tuple[str, int, str], Outcome] = {}
    for old in stored:
        item = by_id.get(old.item_id)
        if (old.detector != "combined" or old.error is not None or old.fingerprint == fingerprint or item is None
                or old.key in current or any(f not in old.features for f in needed)):
            continue
        grounded = grounding.measure(RagInput(question=item.question, passages=item.passages), item.answer).features
        values = features(old.features["direct"], old.features.get("restatement"),
                          [old.features["factoid_max"]] if "factoid_max" in needed else None, grounded)
        score = answer_probability(weights, values, grounded)
        # The spans were scored on the answer's probability (combined._implicated): rescaled to the new one.
        ratio = score / old.score if old.score else 0.0
        fresh[old.key] = old.model_copy(update={
            "score": score, "threshold": threshold, "flagged": score >= threshold, "features": values,
            "fingerprint": fingerprint,
            "factoid_spans": [ScoredSpan(start=s.start, end=s.end, score=s.score * ratio) for s in old.factoid_spans],
            "factoid_scores": [f * ratio for f in old.factoid_scores]})
    return list(fresh.values())
