from morphguard.detectors.combined import Channel, Weights
from morphguard.eval.items import Item
from morphguard.eval.rescore import cascade, rescore, unfinished
from morphguard.eval.runner import Outcome, ScoredSpan

ITEM = Item(id="a", task="QA", question="q", passages=["The clinic opens at nine."],
            answer="The clinic opens at ten.", hallucinated=True)
# A channel that reads only the direct judge's score: probability 0.5 at 0, rising with it.
WEIGHTS = Weights(channels={"invented": Channel(features=["direct"], mean=[0.0], scale=[1.0], coef=[4.0],
                                                intercept=0.0)})


def stored(**update) -> Outcome:
    outcome = Outcome(detector="combined", repeat=0, item_id="a", task="QA", hallucinated=True, score=0.2,
                      threshold=0.5, flagged=False, fingerprint="old", llm_calls=2, seconds=7.0,
                      features={"direct": 1.0, "restatement": 0.0},
                      factoid_spans=[ScoredSpan(start=0, end=10, score=0.1)], factoid_scores=[0.1])
    return outcome.model_copy(update=update)


def test_a_stored_outcome_is_scored_with_the_new_weights_and_keeps_its_cost():
    [fresh] = rescore([ITEM], [stored()], WEIGHTS, "new", threshold=0.3)
    assert fresh.fingerprint == "new" and abs(fresh.score - 1 / (1 + 2.718281828 ** -4)) < 1e-6
    assert fresh.flagged and fresh.threshold == 0.3
    assert (fresh.llm_calls, fresh.seconds) == (2, 7.0)  # the same parts ran
    assert abs(fresh.factoid_spans[0].score - 0.1 * fresh.score / 0.2) < 1e-9  # spans follow the answer's score


def test_outcomes_already_current_or_lacking_a_judge_score_are_left_alone():
    assert rescore([ITEM], [stored(), stored(fingerprint="new")], WEIGHTS, "new", threshold=0.3) == []
    assert rescore([ITEM], [stored(features={"restatement": 0.0})], WEIGHTS, "new", threshold=0.3) == []
    assert rescore([ITEM], [stored(detector="direct")], WEIGHTS, "new", threshold=0.3) == []


def test_grounding_spans_no_stored_span_covers_join_the_stored_ones():
    [fresh] = rescore([ITEM], [stored()], WEIGHTS, "new", threshold=0.3)
    assert [ITEM.answer[s.start:s.end] for s in fresh.factoid_spans] == ["The clinic", "ten"]
    assert abs(fresh.factoid_spans[1].score - fresh.score) < 1e-9  # grounding's only span: its worst
    covered = stored(factoid_spans=[ScoredSpan(start=17, end=24, score=0.1)])
    [again] = rescore([ITEM], [covered], WEIGHTS, "new", threshold=0.3)
    assert [(s.start, s.end) for s in again.factoid_spans] == [(17, 24)]


def test_a_part_the_stored_outcome_lacks_is_read_from_its_own_outcome_with_its_spans_and_cost():
    spotting = Weights(channels={
        "judged": Channel(features=["direct"], mean=[0.0], scale=[1.0], coef=[1.0], intercept=-2.0),
        "spotted": Channel(features=["spotcheck"], mean=[0.0], scale=[1.0], coef=[4.0], intercept=-2.0)})
    spot = Outcome(detector="spotcheck", repeat=0, item_id="a", task="QA", hallucinated=True, score=0.9,
                   fingerprint="s", llm_calls=1, input_tokens=400, seconds=2.5, stage_seconds={"verify": 2.5},
                   factoid_spans=[ScoredSpan(start=0, end=24, score=0.9)], factoid_scores=[0.9])
    assert rescore([ITEM], [stored()], spotting, "new", threshold=0.3) == []  # without it: nothing to read
    # an outcome of the part under other settings than the current ones is not read either
    assert rescore([ITEM], [stored(), spot], spotting, "new", threshold=0.3, parts={"spotcheck": "other"}) == []
    [fresh] = rescore([ITEM], [stored(), spot], spotting, "new", threshold=0.3, parts={"spotcheck": "s"})
    assert fresh.features["spotcheck"] == 0.9
    assert (fresh.llm_calls, fresh.input_tokens, fresh.seconds) == (3, 400, 9.5)
    assert fresh.stage_seconds["spotcheck.verify"] == 2.5
    whole = [s for s in fresh.factoid_spans if (s.start, s.end) == (0, 24)]
    assert len(whole) == 1 and abs(whole[0].score - 0.9 * fresh.score) < 1e-9


def test_a_part_run_again_since_replaces_the_stored_score_and_adds_only_the_spans_not_stored():
    restating = Weights(channels={
        "judged": Channel(features=["direct"], mean=[0.0], scale=[1.0], coef=[1.0], intercept=-2.0),
        "contradicted": Channel(features=["restatement"], mean=[0.0], scale=[1.0], coef=[4.0], intercept=-2.0)})
    again = Outcome(detector="restatement", repeat=0, item_id="a", task="QA", hallucinated=True, score=0.8,
                    fingerprint="r2", llm_calls=1, seconds=1.5, stage_seconds={"verify": 1.5},
                    factoid_spans=[ScoredSpan(start=0, end=24, score=0.8)], factoid_scores=[0.8])
    before = stored(factoid_spans=[ScoredSpan(start=0, end=10, score=0.1)])
    [kept] = rescore([ITEM], [before, again], restating, "new", threshold=0.3, parts={"restatement": "r1"})
    assert kept.features["restatement"] == 0.0  # the stored score: no outcome under the current settings
    [fresh] = rescore([ITEM], [before, again], restating, "new", threshold=0.3, parts={"restatement": "r2"})
    assert fresh.features["restatement"] == 0.8
    assert (fresh.llm_calls, fresh.seconds) == (2, 7.0)  # its calls were already counted in the stored run
    # (0, 24) overlaps a stored span; grounding's "ten" joins as in any rescore
    assert [(s.start, s.end) for s in fresh.factoid_spans] == [(0, 10), (20, 23)]
    apart = stored(factoid_spans=[])
    [fresh] = rescore([ITEM], [apart, again], restating, "new", threshold=0.3, parts={"restatement": "r2"})
    assert (0, 24) in [(s.start, s.end) for s in fresh.factoid_spans]


def test_weights_without_a_part_the_stored_outcome_holds_leave_it_for_a_fresh_run():
    without_direct = Weights(channels={
        "contradicted": Channel(features=["restatement"], mean=[0.0], scale=[1.0], coef=[4.0], intercept=-2.0)})
    assert rescore([ITEM], [stored()], without_direct, "new", threshold=0.3) == []  # direct's spans, direct's time


def test_a_profiles_own_outcomes_are_rescored_under_its_name():
    fast = stored(detector="combined:fast")
    assert rescore([ITEM], [fast], WEIGHTS, "new", threshold=0.3) == []  # not the default's
    [fresh] = rescore([ITEM], [fast], WEIGHTS, "new", threshold=0.3, detector="combined:fast")
    assert fresh.detector == "combined:fast" and fresh.fingerprint == "new"


def test_the_cascade_reads_the_fast_profiles_outcome_outside_its_band_and_the_whole_checks_inside():
    whole = stored(score=0.35, fingerprint="whole", llm_calls=3, seconds=9.0)
    record = stored(item_id="r", score=0.9, fingerprint="whole", llm_calls=0, features={"unsupported": 1.0})
    firsts = [stored(detector="combined:fast", score=0.1, llm_calls=2, seconds=3.0, features={"restatement": 0.0},
                     factoid_spans=[]),
              stored(detector="combined:fast", item_id="r", score=0.1, llm_calls=0, features={"unsupported": 1.0})]
    skipped, about_record = cascade([whole, record], firsts, (0.2, 0.45), "cascade", threshold=0.3)
    assert (skipped.detector, skipped.fingerprint, skipped.score, skipped.llm_calls, skipped.seconds) == (
        "combined", "cascade", 0.1, 2, 3.0)
    assert skipped.factoid_spans == [] and not skipped.flagged
    assert about_record.score == 0.9 and about_record.flagged  # no judge part asked: the default's weights score it
    [asked] = cascade([whole], [firsts[0].model_copy(update={"score": 0.3})], (0.2, 0.45), "cascade", threshold=0.3)
    assert (asked.score, asked.llm_calls, asked.seconds, asked.flagged) == (0.35, 3, 9.0, True)
    assert cascade([whole], [], (0.2, 0.45), "cascade", threshold=0.3) == []  # no first stage: left for a fresh run


def test_a_part_run_again_on_only_some_answers_is_reported_so_that_no_rescore_mixes_its_settings():
    """A part rerun under new settings that has reached some answers but not all: rescoring then would read its new
    score on some answers and the stored one on the rest."""
    other = Item(id="b", task="QA", question="q", passages=ITEM.passages, answer=ITEM.answer, hallucinated=False)
    spot = Outcome(detector="spotcheck", repeat=0, item_id="a", task="QA", hallucinated=True, score=0.9,
                   fingerprint="s2", llm_calls=1, seconds=2.5)
    run = [stored(), stored(item_id=other.id), spot]
    assert unfinished(run, "combined", {"spotcheck": "s2"}) == {"spotcheck": (1, 2)}
    assert unfinished(run + [spot.model_copy(update={"item_id": "b"})], "combined", {"spotcheck": "s2"}) == {}
    assert unfinished(run, "combined", {"spotcheck": "s3"}) == {}  # no current outcome: settings unchanged


def test_an_answer_that_quotes_its_context_is_rescored_as_the_check_scores_it_without_the_judge():
    quoting = ITEM.model_copy(update={"answer": "The clinic opens at nine.", "hallucinated": False})
    [fresh] = rescore([quoting], [stored(hallucinated=False)], WEIGHTS, "new", threshold=0.3)
    assert abs(fresh.score - 0.5) < 1e-9  # the direct channel read at 0, not at the stored 1.0
    assert (fresh.llm_calls, fresh.features["direct"], fresh.factoid_spans) == (0, 0.0, [])


def test_an_answer_no_longer_read_as_a_quote_is_left_for_a_fresh_run_when_its_stored_outcome_asked_no_judge():
    """A quote was scored with stand-in zeros for the judge parts; once the answer no longer counts as a quote, those
    zeros are no replies to read."""
    unquoted = ITEM.model_copy(update={"answer": "Yes. The clinic opens at nine.", "hallucinated": False})
    stand_ins = stored(hallucinated=False, llm_calls=0, features={"direct": 0.0, "restatement": 0.0})
    assert rescore([unquoted], [stand_ins], WEIGHTS, "new", threshold=0.3) == []
    assert len(rescore([unquoted], [stored(hallucinated=False)], WEIGHTS, "new", threshold=0.3)) == 1
