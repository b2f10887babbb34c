import itertools

import pytest

from morphguard.detectors.scoring import (
    expected_penalty,
    factoid_score,
    is_flagged,
    penalty,
    response_score,
)
from morphguard.models import Judgment as V
from morphguard.models import VariantKind as K


@pytest.mark.parametrize(("kind", "verdict", "expected"), [
    (K.SYNONYM, V.YES, 0.0), (K.SYNONYM, V.NOT_SURE, 0.5), (K.SYNONYM, V.NO, 1.0),
    (K.ANTONYM, V.YES, 1.0), (K.ANTONYM, V.NOT_SURE, 0.5), (K.ANTONYM, V.NO, 0.0),
    (K.IDENTITY, V.YES, 0.0), (K.IDENTITY, V.NOT_SURE, 0.5), (K.IDENTITY, V.NO, 1.0),
])
def test_penalty_table_matches_the_paper(kind, verdict, expected):
    assert penalty(kind, verdict) == expected


@pytest.mark.parametrize(("kind", "verdict"), list(itertools.product(K, V)))
def test_a_certain_soft_verdict_costs_the_same_as_the_discrete_one(kind, verdict):
    certain = {v: 1.0 if v is verdict else 0.0 for v in V}
    assert expected_penalty(kind, certain) == penalty(kind, verdict)


def test_soft_penalty_is_the_probability_weighted_average():
    probs = {V.YES: 0.6, V.NO: 0.3, V.NOT_SURE: 0.1}
    assert expected_penalty(K.SYNONYM, probs) == pytest.approx(0.3 * 1 + 0.1 * 0.5)
    assert expected_penalty(K.ANTONYM, probs) == pytest.approx(0.6 * 1 + 0.1 * 0.5)


def test_soft_penalty_without_mass_falls_back_to_not_sure():
    assert expected_penalty(K.ANTONYM, {}) == 0.5


def test_factoid_score_is_the_mean_over_its_variants():
    # N = 2: two synonyms (YES, NOT SURE) and two antonyms (YES, NO) -> (0 + .5 + 1 + 0) / 4
    assert factoid_score([0.0, 0.5, 1.0, 0.0]) == pytest.approx(0.375)


def test_factoid_without_variants_cannot_be_scored():
    with pytest.raises(ValueError):
        factoid_score([])


def test_response_score_is_the_worst_factoid_and_zero_without_factoids():
    assert response_score([0.1, 0.75, 0.25]) == 0.75
    assert response_score([]) == 0.0


def test_flagged_at_and_above_the_threshold():
    assert is_flagged(0.5, 0.5)
    assert not is_flagged(0.4999, 0.5)
    assert is_flagged(0.3, 0.3)
