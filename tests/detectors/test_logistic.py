"""The logistic function and its inverse that every fitted score reads, and the clips the checks read them with."""

import math

import pytest

from morphguard.detectors.logistic import log_odds, sigmoid
from morphguard.detectors.sentences import SCORE_CLIP, score_log_odds


@pytest.mark.parametrize("p", [0.001, 0.2, 0.5, 0.9, 0.999])
def test_log_odds_and_the_logistic_undo_each_other(p):
    assert sigmoid(log_odds(p)) == pytest.approx(p)


def test_certain_probabilities_have_finite_log_odds_by_the_clip():
    assert log_odds(0.0) == pytest.approx(-math.log(1 / 1e-9 - 1))
    assert log_odds(1.0) == pytest.approx(-log_odds(0.0))
    assert score_log_odds(1.0) == pytest.approx(math.log(1 / SCORE_CLIP - 1)) == log_odds(1.0, SCORE_CLIP)


def test_the_logistic_is_bounded_so_that_no_log_odds_overflow():
    assert sigmoid(-1e6) == sigmoid(-60.0) > 0.0 and sigmoid(1e6) == 1.0

