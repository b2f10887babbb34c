"""`morphguard eval --fit` and the combined check, end to end: the command run in this process (tests/commands.py),
a scripted judge on loopback."""

import json
import math

import pytest
import yaml

from morphguard.detectors.combined import Channel, Weights, load_weights
from morphguard.errors import MorphguardError
from morphguard.eval import fit, metrics
from tests.commands import morphguard
from tests.detectors.scripted_judge import _tag, stage_of
from tests.scripted_llm import ScriptedLLM, completion

CITIES = ["Paris", "Berlin", "Madrid", "Rome", "Vienna", "Lisbon"]
RECORDS = [
    {"id": f"{city}-{n}", "group": city, "question": f"Where is landmark {n}?",
     "context": [f"Landmark {n} stands in {city}. It is old."],
     "answer": f"Landmark {n} stands in {CITIES[(i + 1) % 6] if n % 2 else city}. It is old.",
     "hallucinated": bool(n % 2)}
    for i, city in enumerate(CITIES) for n in range(4)
]


def judge(body):
    """Says NO where the answer's city is not the context's (or the source sentence's), YES elsewhere; factoids
    are the sentences."""
    stage = stage_of(body)
    user = body["messages"][-1]["content"]
    if stage == "decompose":
        return json.dumps({"factoids": [s.strip() + "." for s in _tag(user, "answer").split(".") if s.strip()]})
    if stage == "restatement":  # the changed copy against its source sentence alone
        moved = any(c in _tag(user, "restatement") and c not in _tag(user, "source") for c in CITIES)
        return completion("NO" if moved else "YES")
    context = user.split("<passages>")[1].split("</passages>")[0] if "<passages>" in user else user
    claim = _tag(user, "answer") if stage == "direct" else _tag(user, "statement")
    wrong = any(c in claim and c not in context for c in CITIES)
    if stage == "direct":
        return json.dumps({"verdict": "NO" if wrong else "YES", "unsupported": []})
    if stage == "spotcheck":
        return completion("NO" if wrong else "YES")
    return completion(json.dumps({"verdict": "NO" if wrong else "YES"}))


def run(tmp_path, base_url, *args, config=None):
    data = tmp_path / "landmarks.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"judge": {"model": "openai/scripted", "api_base": base_url, "api_key": "k"},
                                    **(config or {})}))
    return morphguard("eval", "--config", str(path), "--dataset", f"jsonl:{data}", *args, cwd=tmp_path)


def test_fit_learns_weights_from_the_parts_and_the_combined_check_uses_them(tmp_path):
    weights = tmp_path / "weights.json"
    with ScriptedLLM(judge) as server:
        fitted = run(tmp_path, server.base_url, "--fit", str(weights), "--limit", "16",
                     "--fit-without-judge", f"jsonl:{tmp_path / 'landmarks.jsonl'}")
        assert fitted.returncode == 0, fitted.stderr
        calls = len(server.requests)
        learned = Weights.model_validate_json(weights.read_text())
        assert learned.fitted_on["items"] == 16 and learned.fitted_on["hallucinated"] == 8
        # the dataset's other answers teach the channels that need no judge: read, not judged. Each judged answer
        # costs a direct call and a spot check (of its sentence with an unsupported name, or, in a faithful answer,
        # of its fullest sentence); the 8 wrong ones also a restatement (a changed copy)
        assert learned.fitted_on["items_without_judge"] == 8 and calls == 16 + 16 + 8
        assert learned.fitted_on["fingerprints"].keys() == {"direct", "restatement", "spotcheck"}  # shipped parts
        assert learned.tuning == load_weights(None).tuning  # the figures the check ran with: the shipped ones
        # the swapped city is a name the context lacks, a changed copy and the judge's NO on the whole answer and on
        # the sentence: each raises its channel
        invented, contradicted, judged, spotted = (learned.channels[c]
                                                   for c in ("invented", "contradicted", "judged", "spotted"))
        assert invented.coef[invented.features.index("unsupported_names")] > 0
        assert contradicted.coef[contradicted.features.index("restatement")] > 0
        assert judged.coef[judged.features.index("direct")] > 0
        assert spotted.coef[spotted.features.index("spotcheck")] > 0
        checked = run(tmp_path, server.base_url, "--detector", "combined,grounding",
                      config={"combined": {"weights": str(weights)}})
    assert checked.returncode == 0, checked.stderr
    row = next(line for line in checked.stdout.splitlines() if line.startswith("| combined |"))
    assert "| 1.000 [1.00, 1.00] |" in row  # AUROC: the judge's verdicts separate the answers


def test_a_fit_without_the_parts_is_refused_with_a_reason(tmp_path):
    data = tmp_path / "f.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    refused = morphguard("eval", "--dataset", f"jsonl:{data}", "--fit", str(tmp_path / "w.json"), "--detector",
                         "grounding", cwd=tmp_path)
    assert refused.returncode == 2 and "--fit needs one or more of the combined check's judge parts" in refused.stderr


def test_answers_no_judge_read_teach_only_the_channel_that_needs_none_and_contrast_sets_never_teach_it():
    def row(names: float, direct: float | None) -> dict[str, float]:
        judged = {} if direct is None else {"direct": direct, "restatement": direct}
        return {**judged, "unsupported": names, "unsupported_numbers": 0.0, "unsupported_names": names,
                "negation_conflict": 0.0}

    # Judged rows: the judge separates the answers and vocabulary does not; unjudged rows: vocabulary separates them.
    judged = [row(0.5, float(n % 2)) for n in range(40)]
    unjudged = [row(float(n % 2), None) for n in range(40)]
    labels = [bool(n % 2) for n in range(40)] * 2
    groups = [f"g{n % 8}" for n in range(80)]
    weights = fit.fit(judged + unjudged, labels, groups, {}, ["ragtruth-qa"] * 40 + ["ragtruth-summary"] * 40)
    invented = weights.channels["invented"]
    assert invented.coef[invented.features.index("unsupported_names")] > 0.5  # learned from the unjudged rows
    assert weights.fitted_on["items"] == 40 and weights.fitted_on["items_without_judge"] == 40

    # The same unjudged rows named as a contrast set teach the invented channel nothing: its words do not move it.
    contrast = fit.fit(judged + unjudged, labels, groups, {}, ["ragtruth-qa"] * 40 + ["contrast-summary"] * 40)
    assert contrast.channels["invented"].coef == [0.0, 0.0, 0.0]


def test_a_fit_on_contrast_sets_alone_is_refused_with_a_reason_not_a_traceback():
    rows = [{"direct": float(n % 2), "restatement": float(n % 2), "unsupported": 0.0, "unsupported_numbers": 0.0,
             "unsupported_names": 0.0, "negation_conflict": 0.0} for n in range(40)]
    with pytest.raises(MorphguardError, match="the invented channel has no hallucinated or no faithful answers"):
        fit.fit(rows, [bool(n % 2) for n in range(40)], [f"g{n % 8}" for n in range(40)], {}, ["contrast-qa"] * 40)


def test_datasets_without_a_judge_need_a_fit_to_join(tmp_path):
    data = tmp_path / "f.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    refused = morphguard("eval", "--dataset", f"jsonl:{data}", "--detector", "grounding", "--fit-without-judge",
                         f"jsonl:{data}", cwd=tmp_path)
    assert refused.returncode == 2 and "give --fit too" in refused.stderr


def test_weights_give_probabilities_and_explain_them():
    a = Channel(features=["a"], mean=[0.0], scale=[1.0], coef=[2.0], intercept=0.0)
    b = Channel(features=["b"], mean=[1.0], scale=[2.0], coef=[1.0], intercept=0.0)
    weights = Weights(channels={"a": a, "b": b})
    assert weights.probability({"a": 0.0, "b": 1.0}) == 0.75  # either channel at 0.5: 1 - 0.5 * 0.5
    assert weights.probability({"a": 3.0, "b": 1.0}) > 0.99  # one channel sure is enough
    assert weights.contributions({"a": 1.0, "b": 5.0}) == {"a": 0.881, "a.a": 2.0, "b": 0.881, "b.b": 2.0}
    calibrated = weights.model_copy(update={"calibration": (1.0, -math.log(3))})
    assert abs(calibrated.probability({"a": 0.0, "b": 1.0}) - 0.5) < 1e-9  # log-odds of 0.75, less log 3


def test_answers_over_a_short_context_get_a_calibration_of_their_own_which_recalibrating_fits_alone():
    def row(direct: float) -> dict[str, float]:
        return {"direct": direct, "restatement": 0.0, "unsupported": 0.0, "unsupported_numbers": 0.0,
                "unsupported_names": 0.0, "negation_conflict": 0.0}

    # Over long contexts the judge's NO is right two times in three; over short ones, every time.
    long_rows = [row(float(n % 2)) for n in range(60)]
    long_labels = [bool(n % 2) == (n % 3 != 0) for n in range(60)]
    short_rows = [row(float(n % 2)) for n in range(40)]
    short_labels = [bool(n % 2) for n in range(40)]
    values, labels = long_rows + short_rows, long_labels + short_labels
    groups = [f"g{n % 10}" for n in range(100)]
    short = [False] * 60 + [True] * 40
    sources = ["ragtruth-qa"] * 60 + ["halueval"] * 40
    both = fit.fit(values, labels, groups, {}, sources, short=short)
    assert both.fitted_on["items_over_short_context"] == 40
    said_no, said_yes = row(1.0), row(0.0)
    assert both.probability(said_no, short=True) > both.probability(said_no) > 0.5  # surer where it is right
    assert both.probability(said_yes, short=True) < both.probability(said_yes) < 0.5
    # the default calibration is the long contexts' alone: recalibrating on them gives it back
    assert fit.recalibrate(both, long_rows, long_labels, {}, sources[:60]).calibration == pytest.approx(
        both.calibration, abs=1e-3)
    without = both.model_copy(update={"short_calibration": None})
    assert without.probability(said_no, short=True) == without.probability(said_no)  # none: the default stands

    # Recalibrating on the short answers alone keeps the channels and the default calibration, and fits the short one.
    again = fit.recalibrate(without, short_rows, short_labels, {"datasets": ["mine"]}, sources[60:], [True] * 40)
    assert again.channels == without.channels and again.calibration == without.calibration
    assert again.short_calibration == pytest.approx(both.short_calibration, abs=1e-3)
    assert again.fitted_on["recalibrated"]["calibrations"] == ["short_calibration"]
    with pytest.raises(MorphguardError, match="--recalibrate needs at least 5 hallucinated and 5 faithful"):
        fit.recalibrate(without, short_rows[:8], short_labels[:8], {}, short=[True] * 8)


def test_recalibrating_from_the_command_line_keeps_the_shipped_channels_and_refuses_too_few_answers(tmp_path):
    weights = tmp_path / "weights.json"
    every_context_short = {"combined": {"short_context": 39}}  # the landmarks' contexts have 37 to 39 characters
    with ScriptedLLM(judge) as server:
        done = run(tmp_path, server.base_url, "--fit", str(weights), "--recalibrate", config=every_context_short)
        assert done.returncode == 0, done.stderr
        few = run(tmp_path, server.base_url, "--fit", str(tmp_path / "few.json"), "--recalibrate", "--limit", "6",
                  config=every_context_short)
    learned, shipped = Weights.model_validate_json(weights.read_text()), load_weights(None)
    assert learned.channels == shipped.channels and learned.calibration == shipped.calibration
    assert learned.short_calibration != shipped.short_calibration
    assert learned.fitted_on["recalibrated"]["items_over_short_context"] == len(RECORDS)
    assert learned.fitted_on["datasets"] == shipped.fitted_on["datasets"]  # what the channels learnt from stays said
    # the file carries the figures the check ran with: the shipped ones, with the config's short-context limit
    assert learned.tuning == shipped.tuning.model_copy(update={"short_context": 39})
    assert few.returncode == 2 and "--recalibrate needs at least 5 hallucinated" in few.stderr
    assert not (tmp_path / "few.json").exists()


def test_calibration_error_is_zero_for_honest_probabilities_and_large_for_overconfident_ones():
    labels = [True] * 3 + [False] * 7
    assert metrics.calibration_error(labels, [0.3] * 10) < 1e-9
    assert round(metrics.calibration_error(labels, [0.95] * 10), 2) == 0.65


def test_weights_fitted_without_the_per_factoid_judge_make_the_combined_check_one_call(tmp_path):
    weights = tmp_path / "weights.json"
    with ScriptedLLM(judge) as server:
        assert run(tmp_path, server.base_url, "--fit", str(weights), "--detector", "direct").returncode == 0
        before = len(server.requests)
        checked = run(tmp_path, server.base_url, "--detector", "combined",
                      config={"combined": {"weights": str(weights)}})
        calls = len(server.requests) - before
    assert checked.returncode == 0, checked.stderr
    assert "factoid_max" not in Weights.model_validate_json(weights.read_text()).features
    # one direct call per answer, nothing else; none for the faithful ones, which quote their context
    assert calls == sum(r["hallucinated"] for r in RECORDS)


def test_weights_fitted_without_direct_make_the_combined_check_skip_it(tmp_path):
    weights = tmp_path / "weights.json"
    with ScriptedLLM(judge) as server:
        fitted = run(tmp_path, server.base_url, "--fit", str(weights), "--detector", "restatement,spotcheck")
        assert fitted.returncode == 0, fitted.stderr
        before = len(server.requests)
        checked = run(tmp_path, server.base_url, "--detector", "combined",
                      config={"combined": {"weights": str(weights)}})
        stages = {stage_of(r) for r in server.requests[before:]}
    assert checked.returncode == 0, checked.stderr
    learned = Weights.model_validate_json(weights.read_text())
    assert "direct" not in learned.features and {"restatement", "spotcheck"} <= learned.features
    assert "direct" not in stages and stages  # the short parts were asked, the whole-answer verdict never


CAFES = [  # answers about a structured record: wrong where they state a field against its value
    {"id": f"cafe-{n}", "group": f"street-{n % 4}", "question": "Describe the business.",
     "context": [json.dumps({"name": f"Cafe {n}", "attributes": {"OutdoorSeating": n % 3 == 0, "WiFi": "free",
                                                                  "RestaurantsTakeOut": True}})],
     "answer": f"Cafe {n} offers free WiFi and take-out, and has outdoor seating.", "hallucinated": n % 3 != 0}
    for n in range(12)
]


def test_answers_about_records_teach_their_own_channel_and_are_checked_without_the_judge(tmp_path):
    cafes = tmp_path / "cafes.jsonl"
    cafes.write_text("".join(json.dumps(r) + "\n" for r in CAFES))
    weights = tmp_path / "weights.json"
    with ScriptedLLM(judge) as server:
        fitted = run(tmp_path, server.base_url, "--fit", str(weights), "--fit-without-judge", f"jsonl:{cafes}")
        assert fitted.returncode == 0, fitted.stderr
        learned = Weights.model_validate_json(weights.read_text())
        assert learned.record_calibration is not None
        assert (learned.fitted_on["items_about_records"], learned.fitted_on["hallucinated_about_records"]) == (12, 8)
        assert learned.channels["misread"].coef[0] > 0
        before = len(server.requests)
        checked = run(tmp_path, server.base_url, "--dataset", f"jsonl:{cafes}", "--detector", "combined",
                      config={"combined": {"weights": str(weights)}})
        assert checked.returncode == 0, checked.stderr
        assert len(server.requests) == before  # no judge call for an answer about a record
    row = next(line for line in checked.stdout.splitlines() if line.startswith("| combined |"))
    assert "| 1.000 [1.00, 1.00] |" in row


def test_a_cascade_rescored_from_both_profiles_runs_equals_a_fresh_cascade(tmp_path):
    """`--rescore` reads the default's cascade from a finished run of the whole check (every part asked) and of the
    fast profile, without the judge; a fresh run of the cascade with the same judge gives the same scores. Where the
    context is short (`combined.short_context`) both ask every part at once, wherever the first stage lies, and read
    the answer with the short contexts' calibration."""

    def outcomes(folder, detector, fingerprint=None):  # the last line per answer
        rows = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]
        return {r["item_id"]: r for r in rows if r["detector"] == detector and r["fingerprint"] != fingerprint}

    with ScriptedLLM(judge) as server:
        both = run(tmp_path, server.base_url, "--detector", "combined,combined:fast",
                   config={"combined": {"cascade": None, "short_context": 38}})
        assert both.returncode == 0, both.stderr
        asked = len(server.requests)
        # The scripted judge's wrong answers inside the band, the right ones outside; the contexts about Rome and
        # Paris (37 and 38 characters) are short, the others (39) not.
        band = {"combined": {"cascade": [0.5, 1.0], "short_context": 38}}
        rescored = run(tmp_path, server.base_url, "--detector", "combined", "--rescore", config=band)
        assert rescored.returncode == 0, rescored.stderr
        assert len(server.requests) == asked  # read from the stored outcomes, not the judge
        fresh = run(tmp_path, server.base_url, "--detector", "combined", "--out", str(tmp_path / "fresh"), config=band)
        assert fresh.returncode == 0, fresh.stderr
    [folder] = (tmp_path / "runs" / "eval").iterdir()
    first, again = outcomes(folder, "combined:fast"), outcomes(tmp_path / "fresh", "combined")
    cascade = outcomes(folder, "combined")
    whole = outcomes(folder, "combined", fingerprint=next(iter(again.values()))["fingerprint"])
    assert len(again) == len(RECORDS) and cascade.keys() == again.keys() == whole.keys()
    for item, row in again.items():
        assert cascade[item]["fingerprint"] == row["fingerprint"] != whole[item]["fingerprint"]
        assert cascade[item]["score"] == pytest.approx(row["score"])
        # a faithful answer here is its context as written: it quotes it, so no judge and no first stage
        quoted = not row["hallucinated"]
        skipped = not quoted and first[item]["score"] < 0.5 and not item.startswith(("Rome", "Paris"))
        assert ("direct" not in row["features"]) == skipped
        assert row["score"] == pytest.approx(first[item]["score"] if skipped else whole[item]["score"])
    # each way taken: skipped, asked in the band, asked at once for a short context the band would have skipped
    assert {(r["score"] < 0.5, i.startswith(("Rome", "Paris"))) for i, r in first.items()} == {
        (True, False), (False, False), (True, True), (False, True)}

    # Rescored where every context counts as short (the default limit, 700), the whole check reads each answer with
    # the short contexts' calibration, as a fresh run does: the Rome and Paris answers as before, the others anew.
    with ScriptedLLM(judge) as server:
        wide = {"combined": {"cascade": None}}
        assert run(tmp_path, server.base_url, "--detector", "combined", "--rescore", config=wide).returncode == 0
        assert not server.requests
        assert run(tmp_path, server.base_url, "--detector", "combined", "--out", str(tmp_path / "wide"),
                   config=wide).returncode == 0
    rescored, fresh_wide = outcomes(folder, "combined"), outcomes(tmp_path / "wide", "combined")
    assert rescored.keys() == fresh_wide.keys() == whole.keys()
    for item, row in fresh_wide.items():
        assert rescored[item]["fingerprint"] == row["fingerprint"]
        assert rescored[item]["score"] == pytest.approx(row["score"])
        short = item.startswith(("Rome", "Paris"))
        assert (row["score"] == pytest.approx(whole[item]["score"])) == short
