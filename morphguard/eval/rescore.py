"""`morphguard eval --rescore`: the combined check scored anew from a finished run, without the judge.

The combined check's outcome keeps its judge parts' scores among its features (`direct`, `restatement`,
`factoid_max`), and grounding costs nothing to recompute from the item. A new weights file (a refit, say on
reviewed production decisions) can therefore be read on a finished run exactly as a fresh run would read it
with the same judge replies: this writes those outcomes under the current fingerprint, so the report that
follows is the new weights'. Cost and time are the stored run's, since the same parts ran; an answer about a
structured record that the new weights score without the judge costs what grounding costs and keeps only
grounding's spans. Otherwise the stored spans keep their places, rescaled to the new probability, and where
grounding now points at a part of the answer no stored span covers (a check added since, such as a record
field stated against its value), that span joins them, scored as the combined check scores grounding's spans.
"""

from __future__ import annotations

from collections.abc import Sequence

from morphguard.detectors.combined import Weights, answer_probability, features, vocabulary_features
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
        measured = grounding.measure(RagInput(question=item.question, passages=item.passages), item.answer)
        grounded = measured.features
        record = weights.reads_record(grounded)
        values = (vocabulary_features(grounded) if record else
                  features(old.features["direct"], old.features.get("restatement"),
                           [old.features["factoid_max"]] if "factoid_max" in needed else None, grounded))
        score = answer_probability(weights, values, grounded)
        # The spans were scored on the answer's probability (combined._implicated): rescaled to the new one.
        ratio = score / old.score if old.score else 0.0
        kept = [] if record else old.factoid_spans
        spans = [ScoredSpan(start=s.start, end=s.end, score=s.score * ratio) for s in kept]
        new = [f for f in measured.factoids if f.start is not None and f.end is not None
               and not any(s.start < f.end and f.start < s.end for s in kept)]
        worst = max((f.score for f in measured.factoids), default=0.0)
        added = [ScoredSpan(start=f.start, end=f.end, score=score * f.score / worst) for f in new if worst]
        # An answer the weights score without the judge costs what grounding costs, as in a fresh run.
        cost = ({"llm_calls": 0, "input_tokens": 0, "output_tokens": 0, "seconds": measured.cost.seconds,
                 "stage_seconds": {}} if record else {})
        fresh[old.key] = old.model_copy(update={
            "score": score, "threshold": threshold, "flagged": score >= threshold, "features": values,
            "fingerprint": fingerprint, "factoid_spans": spans + added,
            "factoid_scores": ([] if record else [f * ratio for f in old.factoid_scores]) + [s.score for s in added],
            **cost})
    return list(fresh.values())
