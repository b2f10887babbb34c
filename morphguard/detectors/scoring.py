"""MetaRAG's arithmetic: the penalty table, factoid scores (mean) and the response score (max)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from morphguard.models import Judgment, VariantKind

# What a judgment costs a variant: a synonym (or the factoid itself) should be entailed,
# an antonym should be contradicted; NOT SURE costs half either way.
PENALTY: dict[VariantKind, dict[Judgment, float]] = {
    VariantKind.SYNONYM: {Judgment.YES: 0.0, Judgment.NOT_SURE: 0.5, Judgment.NO: 1.0},
    VariantKind.IDENTITY: {Judgment.YES: 0.0, Judgment.NOT_SURE: 0.5, Judgment.NO: 1.0},
    VariantKind.ANTONYM: {Judgment.YES: 1.0, Judgment.NOT_SURE: 0.5, Judgment.NO: 0.0},
}


def penalty(kind: VariantKind, verdict: Judgment) -> float:
    return PENALTY[kind][verdict]


def expected_penalty(kind: VariantKind, probabilities: Mapping[Judgment, float]) -> float:
    """The penalty averaged over the verifier's belief in each verdict (soft verdicts)."""
    total = sum(probabilities.values())
    if total <= 0:
        return penalty(kind, Judgment.NOT_SURE)
    return sum(PENALTY[kind][v] * p for v, p in probabilities.items()) / total


def factoid_score(penalties: Iterable[float]) -> float:
    """S_i: the mean penalty over a factoid's variants (0 = consistent with the context, 1 = not)."""
    values = list(penalties)
    if not values:
        raise ValueError("a factoid needs at least one verified variant to be scored")
    return sum(values) / len(values)


def response_score(factoid_scores: Iterable[float]) -> float:
    """H: the worst factoid decides; an answer that states no fact scores 0."""
    return max(factoid_scores, default=0.0)


def is_flagged(score: float, threshold: float) -> bool:
    return score >= threshold
