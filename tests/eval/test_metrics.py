import pytest

from morphguard.eval import metrics


def test_confusion_and_rates_by_hand():
    labels = [True, True, True, False, False, False, False]
    flagged = [True, True, False, True, False, False, False]
    b = metrics.confusion(labels, flagged)
    assert (b.tp, b.fp, b.fn, b.tn) == (2, 1, 1, 3)
    assert b.precision == pytest.approx(2 / 3)
    assert b.recall == pytest.approx(2 / 3)
    assert b.f1 == pytest.approx(2 / 3)
    assert b.accuracy == pytest.approx(5 / 7)


def test_undefined_rates_are_none_not_zero():
    b = metrics.confusion([False, False], [False, False])
    assert b.precision is None and b.recall is None and b.f1 is None
    assert b.accuracy == 1.0


def test_auroc_counts_ties_as_half():
    # positives 0.9, 0.5; negatives 0.5, 0.1 → pairs: (0.9>0.5) 1, (0.9>0.1) 1, (0.5=0.5) 0.5, (0.5>0.1) 1
    assert metrics.auroc([True, True, False, False], [0.9, 0.5, 0.5, 0.1]) == pytest.approx(3.5 / 4)
    assert metrics.auroc([True, False], [0.2, 0.8]) == 0.0
    assert metrics.auroc([True, True], [0.2, 0.8]) is None


def test_pr_auc_is_average_precision():
    # ranked: 0.9 (pos) → P=1 R=.5; 0.8 (neg); 0.7 (pos) → P=2/3 R=1.  AP = .5*1 + .5*2/3
    assert metrics.pr_auc([True, False, True], [0.9, 0.8, 0.7]) == pytest.approx(0.5 + 1 / 3)
    # a tie between a positive and a negative at the top counts as one threshold: P = 1/2 at R = 1
    assert metrics.pr_auc([True, False], [0.5, 0.5]) == pytest.approx(0.5)
    assert metrics.pr_auc([False, False], [0.1, 0.2]) is None


def test_best_threshold_maximises_f1_and_prefers_fewer_alarms():
    labels = [True, True, False, False]
    scores = [0.9, 0.6, 0.4, 0.1]
    assert metrics.best_threshold(labels, scores) == 0.6
    # τ = 0.9 (TP 1, FN 1) and τ = 0.1 (TP 2, FP 2) both give F1 = 2/3: the higher one wins
    assert metrics.best_threshold([True, False, False, True], [0.9, 0.8, 0.7, 0.1]) == 0.9


def test_span_scores_by_character_overlap():
    gold = [[(0, 10)], [(5, 8)], []]
    predicted = [[(5, 15)], [], [(0, 4)]]
    s = metrics.span_scores(gold, predicted)
    # answer 1: gold 10 chars, predicted 10, overlap 5; answer 2: gold 3 missed; answer 3: 4 false chars
    assert (s.predicted, s.gold, s.overlap) == (14, 13, 5)
    assert s.precision == pytest.approx(5 / 14)
    assert s.recall == pytest.approx(5 / 13)
    assert s.f1 == pytest.approx(2 * 5 / (14 + 13))


def test_overlapping_and_touching_spans_count_each_character_once():
    s = metrics.span_scores([[(0, 4), (2, 6)]], [[(0, 3), (3, 6), (1, 5)]])
    assert (s.predicted, s.gold, s.overlap) == (6, 6, 6)
    assert s.f1 == 1.0


def test_span_scores_without_predictions_or_gold():
    none_predicted = metrics.span_scores([[(0, 5)]], [[]])
    assert none_predicted.precision is None and none_predicted.recall == 0.0 and none_predicted.f1 == 0.0
    nothing = metrics.span_scores([[]], [[]])
    assert nothing.f1 is None


def test_curves_run_from_strict_to_loose():
    labels, scores = [True, False, True], [0.9, 0.8, 0.7]
    assert metrics.roc_points(labels, scores) == [(0.0, 0.0), (0.0, 0.5), (1.0, 0.5), (1.0, 1.0)]
    assert metrics.pr_points(labels, scores) == [(0.5, 1.0), (0.5, 0.5), (1.0, pytest.approx(2 / 3))]


def test_spread_over_repeats():
    assert metrics.spread([0.5, 0.7, None]) == {"mean": pytest.approx(0.6), "std": pytest.approx(0.1414213)}
    assert metrics.spread([0.5]) == {"mean": 0.5, "std": None}
