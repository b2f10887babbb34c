import json

import pytest

from morphguard.eval import report
from morphguard.eval.items import Item, Span
from morphguard.eval.runner import Outcome, ScoredSpan

ITEMS = [Item(id=f"i{n}", task="QA" if n < 4 else "Summary", question="q", passages=["p"],
              answer="The sky is green today.", hallucinated=n % 2 == 1,
              spans=[Span(start=11, end=16)] if n % 2 == 1 else []) for n in range(8)]


def outcome(item: Item, score: float, detector="d", threshold=0.5, spans=((11, 16),), localizes=True, repeat=0):
    return Outcome(detector=detector, repeat=repeat, item_id=item.id, task=item.task, hallucinated=item.hallucinated,
                   score=score, threshold=threshold, flagged=score >= threshold, localizes=localizes,
                   factoid_spans=[ScoredSpan(start=s, end=e, score=score) for s, e in spans])


def test_summary_at_the_detectors_own_threshold():
    # hallucinated items score 0.6, faithful 0.4 except i0 (0.7: a false alarm)
    outcomes = [outcome(i, 0.6 if i.hallucinated else (0.7 if i.id == "i0" else 0.4)) for i in ITEMS]
    d = report.summarize(ITEMS, outcomes, ["d"])["detectors"]["d"]
    assert d["threshold"] == 0.5 and not d["calibrated_threshold"]
    assert d["precision"]["mean"] == pytest.approx(4 / 5) and d["recall"]["mean"] == 1.0
    assert d["auroc"]["mean"] == pytest.approx(12 / 16)  # each positive beats 3 of the 4 negatives (not i0)
    # predicted spans: all four hallucinated exactly right (5 chars each), plus i0's 5 false characters
    assert d["span"]["precision"]["mean"] == pytest.approx(20 / 25) and d["span"]["recall"]["mean"] == 1.0
    assert d["per_task"]["QA"]["n"] == 4


def test_calibration_tunes_on_dev_and_reports_on_the_disjoint_test_half():
    # scores separate perfectly around 0.2, far below the detector's own threshold of 0.5
    outcomes = [outcome(i, 0.3 if i.hallucinated else 0.1) for i in ITEMS]
    plain = report.summarize(ITEMS, outcomes, ["d"])["detectors"]["d"]
    tuned = report.summarize(ITEMS, outcomes, ["d"], calibrate=True)
    d = tuned["detectors"]["d"]
    assert plain["recall"]["mean"] == 0.0
    assert d["threshold"] == 0.3 and d["calibrated_threshold"] and d["f1"]["mean"] == 1.0
    assert tuned["evaluated_items"] == 4 and d["outcomes"] == 4


def test_errors_are_counted_not_scored_and_length_gets_no_span_figures():
    outcomes = [outcome(i, 0.9, detector="length", localizes=False, spans=()) for i in ITEMS]
    outcomes[0] = outcomes[0].model_copy(update={"score": None, "error": "boom"})
    d = report.summarize(ITEMS, outcomes, ["length"])["detectors"]["length"]
    assert d["errors"] == 1 and d["outcomes"] == 7 and "span" not in d


def test_repeats_give_a_spread():
    outcomes = [outcome(i, 0.6 if i.hallucinated else 0.4) for i in ITEMS]
    outcomes += [outcome(i, 0.6 if i.hallucinated else (0.55 if i.id in ("i0", "i2") else 0.4), repeat=1)
                 for i in ITEMS]
    d = report.summarize(ITEMS, outcomes, ["d"])["detectors"]["d"]
    assert d["repeats"] == 2
    assert d["precision"]["mean"] == pytest.approx((1 + 4 / 6) / 2) and d["precision"]["std"] > 0


def test_written_report_has_table_json_plots_and_span_page(tmp_path):
    outcomes = [outcome(i, 0.6 if i.hallucinated else 0.4) for i in ITEMS]
    outcomes += [outcome(i, 0.3, detector="length", localizes=False, spans=()) for i in ITEMS]
    summary = report.summarize(ITEMS, outcomes, ["d", "length"])
    paths = report.write(tmp_path, ITEMS, outcomes, summary)
    assert {p.name for p in paths} == {"report.md", "report.json", "roc.png", "pr.png", "scores.png", "spans.html"}
    table = (tmp_path / "report.md").read_text()
    assert "| d | 0.500 | 1.000 | 1.000 | 1.000 |" in table and "| length |" in table
    assert json.loads((tmp_path / "report.json").read_text())["detectors"]["d"]["auroc"]["mean"] == 1.0
    assert all((tmp_path / name).read_bytes()[:4] == b"\x89PNG" for name in ("roc.png", "pr.png", "scores.png"))
    page = (tmp_path / "spans.html").read_text()
    assert '<mark class="gold">green</mark>' in page and '<mark class="pred">green</mark>' in page
    assert "<th>length" not in page  # the length baseline points at nothing


def test_detectors_are_compared_on_the_items_all_of_them_scored():
    outcomes = [outcome(i, 0.6 if i.hallucinated else 0.4) for i in ITEMS]
    outcomes += [outcome(i, 0.3, detector="slow") for i in ITEMS[:4]]  # a run still going
    outcomes.append(outcome(ITEMS[5], 0.9, detector="slow").model_copy(update={"error": "timeout", "score": None}))
    summary = report.summarize(ITEMS, outcomes, ["d", "slow"])
    assert summary["items"] == 4 and summary["sampled_items"] == 8
    assert summary["detectors"]["d"]["outcomes"] == 4 and summary["detectors"]["slow"]["errors"] == 1
    assert "only the 4 of 8 sampled items" in report.markdown(summary)
