"""The `sentences` check against a scripted judge on a real loopback socket: how it batches the sentences, what
it sends, how it reads the verdicts (phrases, the whole answer, replies it cannot read), how its calibration makes
them a probability, from which thread its text work runs, and how many calls a check may make."""

from __future__ import annotations

import asyncio
import json
import math
import re
import threading
from typing import Any

import pytest

from morphguard.config import Config
from morphguard.detectors import build_detector, sentences
from morphguard.errors import LLMError, MorphguardError
from morphguard.llm.client import call_budget
from morphguard.models import RagInput
from morphguard.policy.engine import PolicyEngine
from morphguard.settle.check import Checker
from morphguard.settle.values import Answer, CheckOutcome, CheckRequest
from tests.scripted_llm import ScriptedLLM, asked_sentences, error, sentences_reply
from tests.scripted_llm import sentences_score as probability

RAG = RagInput(question="Where is Paris?", passages=["Paris is the capital of France. Lyon is in France too."])


def verdicts(body: dict[str, Any]) -> str:
    """Every numbered sentence of the prompt SUPPORTED, and the answer too."""
    asked = re.findall(r"^(\d+)\. ", body["messages"][-1]["content"], re.M)
    return json.dumps({"sentences": [{"id": int(n), "verdict": "SUPPORTED", "phrases": []} for n in asked],
                       "answer": "SUPPORTED"})


def detector(server: ScriptedLLM, **settings: object):
    config = Config.model_validate({
        "judge": {"model": "openai/scripted", "api_base": server.base_url, "api_key": "sk-test", "timeout_s": 60,
                  "max_attempts": 1},
        "detector": {"name": "sentences"}, "sentences": {"batch": 2, **settings}})
    return build_detector(config)


def test_the_text_work_of_a_check_runs_off_the_event_loop(monkeypatch):
    """Prompts (the focused context of every batch) and the spans of the verdicts grow with the answer and the
    context: none of it may run on the loop, where it would stall every other request."""
    threads: dict[str, set[int]] = {"prompt": set(), "spans": set()}
    render, claims = sentences.render, sentences._claims

    def rendered(*args: Any, **kwargs: Any) -> str:
        threads["prompt"].add(threading.get_ident())
        return render(*args, **kwargs)

    def pointed(*args: Any, **kwargs: Any) -> Any:
        threads["spans"].add(threading.get_ident())
        return claims(*args, **kwargs)

    monkeypatch.setattr(sentences, "render", rendered)
    monkeypatch.setattr(sentences, "_claims", pointed)
    answer = "Paris is the capital of France. Lyon is in France. Nice is in Italy."
    with ScriptedLLM(verdicts) as server:
        check = detector(server, context_budget=1000)

        async def run() -> tuple[int, Any]:
            return threading.get_ident(), await check.detect(RAG, answer)

        loop_thread, detection = asyncio.run(run())
    assert len(server.requests) == 2 and detection.settings["judged"] == 3
    assert threads["prompt"] and threads["spans"]
    assert loop_thread not in threads["prompt"] | threads["spans"]


def test_a_check_past_its_judge_call_budget_reads_the_first_sentences_and_marks_where_the_rest_begins():
    said = [f"Paris is the capital of France number {i}." for i in range(5)]  # 3 batches of 2
    answer = " ".join(said)
    with ScriptedLLM(by_label({"number 1": ["number 1"]})) as server:
        check = detector(server)

        async def run(limit: int) -> Any:
            with call_budget(limit):
                return await check.detect(RAG, answer)

        cut = asyncio.run(run(2))
        assert len(server.requests) == 2 and cut.settings["calls"] == 2
        assert cut.unchecked_from == answer.index(said[4])  # the fifth sentence is left unread
        assert cut.flagged and [f.text for f in cut.factoids if f.label == "unsupported"] == ["number 1"]
        assert all(f.end is not None and f.end <= cut.unchecked_from for f in cut.factoids)
        whole = asyncio.run(run(3))
        assert whole.settings["calls"] == 3 and whole.unchecked_from is None
    assert len(server.requests) == 3  # the first two asked again are the judge cache's


def body_user(body: dict[str, Any]) -> str:
    return str(body["messages"][-1]["content"])


def by_label(unsupported: dict[str, list[str]], whole: str | None = None, named: list[str] | None = None):
    """A judge that finds UNSUPPORTED each sentence holding a key of `unsupported`, naming its phrases (and `named`
    for the whole answer)."""

    def label(sentence: str, passages: str) -> tuple[str, list[str]]:
        found = next((phrases for key, phrases in unsupported.items() if key in sentence), None)
        return ("SUPPORTED", []) if found is None else ("UNSUPPORTED", found)

    return lambda body: sentences_reply(body_user(body), label, whole, named)


FRANCE = ["Paris is the capital of France.", "Lyon is in France.", "Nice is in Italy.", "Lille is in France.",
          "Brest is in France."]


def test_the_sentences_go_in_batches_sent_at_once_each_numbered_from_one_and_read_back_in_place():
    answer = " ".join(FRANCE)
    with ScriptedLLM(by_label({"Lille": []}), delay_s=0.3) as server:
        found = asyncio.run(detector(server).detect(RAG, answer))
    asked = [[s for _, s in asked_sentences(body_user(b))] for b in server.requests]
    # batch 2: every sentence once, in order
    assert sorted(asked, key=lambda batch: FRANCE.index(batch[0])) == [FRANCE[0:2], FRANCE[2:4], FRANCE[4:]]
    assert all([n for n, _ in asked_sentences(body_user(b))] == list(range(1, len(a) + 1))
               for b, a in zip(server.requests, asked, strict=True))
    assert server.max_in_flight == 3  # one round: the batches are asked side by side
    assert sorted(b["max_tokens"] for b in server.requests) == [48 * 1 + 64, 48 * 2 + 64, 48 * 2 + 64]
    assert (found.settings["judged"], found.settings["calls"]) == (5, 3) and found.cost.llm_calls == 3
    # sentence 2 of the second batch is the answer's fourth: its verdict lands there, and only there
    assert [f.text for f in found.factoids] == ["Lille is in France."]
    assert found.flagged and found.score == pytest.approx(probability(whole=True, sentence=True))


def test_every_sentence_is_its_own_entry_however_short_and_hints_name_the_words_the_context_never_uses():
    with ScriptedLLM(by_label({})) as server:
        found = asyncio.run(detector(server).detect(RAG, "Yes. Nice is in Italy."))
    prompt = body_user(server.requests[0])
    assert [s for _, s in asked_sentences(prompt)] == ["Yes.", "Nice is in Italy."]
    assert "2. Nice is in Italy.   [words the documents never use: Nice, Italy]" in prompt
    assert not found.flagged and found.score == pytest.approx(probability(whole=False, sentence=False))
    with ScriptedLLM(by_label({})) as server:
        asyncio.run(detector(server, hints=False).detect(RAG, "Nice is in Italy."))
    assert "never use" not in body_user(server.requests[0])


def test_a_flagged_sentence_is_pointed_at_by_the_phrases_the_judge_names():
    answer = "Paris is the capital of France. Nice is in Italy, near Genoa."
    judge = by_label({"Nice": ["in italy", "near Genoa", "in Spain", " "]})  # any case; absent or blank: ignored
    with ScriptedLLM(judge) as server:
        found = asyncio.run(detector(server).detect(RAG, answer))
    assert [(f.text, answer[f.start:f.end]) for f in found.factoids] == [("in Italy", "in Italy"),
                                                                          ("near Genoa", "near Genoa")]
    # a claim scores its answer's probability: it is flagged at a threshold exactly where its answer is
    assert all(f.score == found.score and f.label == "unsupported" and "names this phrase of the sentence" in f.reason
               for f in found.factoids)


def test_a_flagged_sentence_whose_phrases_are_not_in_it_is_pointed_at_whole():
    answer = "Paris is the capital of France. Nice is in Italy."
    with ScriptedLLM(by_label({"Nice": ["Rome"]})) as server:
        found = asyncio.run(detector(server).detect(RAG, answer))
    [flagged] = found.factoids
    assert (flagged.text, flagged.start, flagged.end) == ("Nice is in Italy.", 32, 49)
    assert "names no phrase" in flagged.reason


def test_the_phrases_named_for_the_whole_answer_are_its_claims_where_they_are_found_in_it():
    """The whole-answer reading names what is unsupported across sentences: where it names phrases found in the
    answer, those are the claims, sharper than a sentence and in place of the sentences' own."""
    answer = "Paris is the capital of France. Nice is in Italy, near Genoa."
    named = ["near genoa", "Paris is the capital", "in Spain"]  # any case; a phrase not in the answer: ignored
    with ScriptedLLM(by_label({"Nice": ["Nice is in Italy"]}, "UNSUPPORTED", named)) as server:
        found = asyncio.run(detector(server).detect(RAG, answer))
    assert '"unsupported"' in server.requests[0]["messages"][0]["content"]
    assert "'unsupported'" in str(server.requests[0]["response_format"])  # the schema asks for the whole's phrases
    assert [(f.text, f.start) for f in found.factoids] == [("Paris is the capital", 0), ("near Genoa", 50)]
    assert all("phrase of the answer" in f.reason and f.score == found.score for f in found.factoids)

    with ScriptedLLM(by_label({"Nice": ["Nice is in Italy"]}, "UNSUPPORTED", ["in Spain"])) as server:
        elsewhere = asyncio.run(detector(server).detect(RAG, answer))
    assert [f.text for f in elsewhere.factoids] == ["Nice is in Italy"]  # none found: the sentences' phrases
    with ScriptedLLM(by_label({}, "SUPPORTED", ["near Genoa"])) as server:
        passed = asyncio.run(detector(server).detect(RAG, answer))
    assert passed.factoids == []  # phrases beside a SUPPORTED verdict name nothing


def test_the_shipped_calibration_puts_the_judges_verdicts_where_the_profiles_thresholds_expect():
    """The shipped probabilities, ordered as the evidence: the profiles' 0.3 flags an answer the judge calls
    UNSUPPORTED as a whole; the sensitive topics' 0.175 also one where it calls only a sentence so; an answer it
    passes wholly passes both."""
    none, sentence, whole, both = (probability(w, s) for w, s in [(False, False), (False, True), (True, False),
                                                                  (True, True)])
    assert none < 0.175 <= sentence < 0.3 <= whole < both < 1.0
    shipped = sentences.shipped()
    assert shipped.records is not None and "benchmarks/judge_quality.py" in shipped.judge
    assert shipped.model_extra is not None and shipped.model_extra["fitted_on"]["half"] == "fit"


def test_an_answer_about_a_record_is_read_by_the_records_calibration():
    record = RagInput(question="Is it open?", passages=['{"name": "Cafe Blue", "attributes": {"WiFi": "no", '
                                                        '"OutdoorSeating": "True"}}'])
    with ScriptedLLM(by_label({"WiFi": []})) as server:
        found = asyncio.run(detector(server).detect(record, "Cafe Blue has outdoor seating. It has free WiFi."))
        prose = asyncio.run(detector(server).detect(RAG, "Paris is the capital of France. It has free WiFi."))
    assert found.features["record"] == 1.0 and found.settings["calibration"] == "records"
    assert prose.features["record"] == 0.0 and prose.settings["calibration"] == "prose"
    assert found.score == pytest.approx(sentences.shipped().probability(found.features, True, 0.6)[0])
    assert found.score != pytest.approx(prose.score)  # the same verdicts, read by another logistic


def test_a_calibration_of_ones_own_replaces_the_shipped_one_and_one_of_the_earlier_form_still_reads(tmp_path):
    answer = "Paris is the capital of France. Lyon is in France."
    own = tmp_path / "own.json"
    own.write_text(json.dumps({"judge": {"model": "openai/scripted"}, "whole_weight": 0.5,
                               "prose": {"coef": {"whole_unsupported": 0.0, "sentence_unsupported": 4.0},
                                         "intercept": -2.0}}))
    earlier = tmp_path / "earlier.json"  # a whole-answer weight and a logistic over the fused score's log-odds
    earlier.write_text(json.dumps({"judge": {"model": "openai/scripted"}, "whole_weight": 0.25,
                                   "calibration": [2.0, 0.0]}))
    with ScriptedLLM(by_label({"Lyon": []}, "SUPPORTED")) as server:
        mine = asyncio.run(detector(server, calibration=str(own)).detect(RAG, answer))
        read = asyncio.run(detector(server, calibration=str(earlier)).detect(RAG, answer))
    assert mine.score == pytest.approx(1 / (1 + math.exp(-2.0)))
    assert str(own) in mine.settings["explanation"][0]["text"]
    # the fused score 0.25 · 0 + 0.75 · 1, its log-odds ln 3 read by the slope 2: 1 / (1 + 3^-2)
    assert read.score == pytest.approx(0.9, abs=1e-3)
    (tmp_path / "broken.json").write_text('{"whole_weight": 0.5}')
    with pytest.raises(MorphguardError, match="not a calibration file"):
        sentences.load_calibration(str(tmp_path / "broken.json"))


def test_the_whole_answer_verdict_weighs_against_the_worst_sentence():
    answer = "Paris is the capital of France. Lyon is in France."
    with ScriptedLLM(by_label({}, whole="UNSUPPORTED")) as server:  # every sentence fine, the answer not
        whole = asyncio.run(detector(server, batch=12).detect(RAG, answer))
    assert whole.features["whole"] == 1.0 and whole.features["worst"] == 0.0
    assert whole.score == pytest.approx(probability(whole=True, sentence=False)) and whole.flagged
    assert whole.factoids == []  # the judge named nothing: the answer is flagged, nothing in it pointed at
    [step] = whole.settings["explanation"]
    weight = sentences.shipped().weight(0.6)
    assert step["step"] == "calibration" and step["before"] == pytest.approx(weight) and "prose" in step["text"]

    with ScriptedLLM(by_label({"Lyon": []}, whole="SUPPORTED")) as server:  # one sentence wrong, the answer fine
        worst = asyncio.run(detector(server, batch=12).detect(RAG, answer))
    assert worst.score == pytest.approx(probability(whole=False, sentence=True))
    assert worst.score < worst.threshold and not worst.flagged
    # the claim scores its answer's probability: not flagged in an answer that is not
    assert [(f.text, f.score) for f in worst.factoids] == [("Lyon is in France.", worst.score)]


def test_the_whole_answer_verdict_is_the_worst_over_the_batches():
    answer = " ".join(FRANCE)
    wholes = iter(["SUPPORTED", "UNSUPPORTED", "SUPPORTED"])

    def judge(body: dict[str, Any]) -> str:
        return sentences_reply(body_user(body), lambda s, p: ("SUPPORTED", []), next(wholes))

    with ScriptedLLM(judge) as server:
        found = asyncio.run(detector(server).detect(RAG, answer))
    assert len(server.requests) == 3 and found.features["whole"] == 1.0
    assert found.score == pytest.approx(probability(whole=True, sentence=False))


@pytest.mark.parametrize(("reply", "unreadable"), [
    ("not JSON at all", 2),
    ('{"sentences": "SUPPORTED", "answer": "SUPPORTED"}', 2),
    ('{"sentences": [{"id": 1, "verdict": "MAYBE"}, {"id": 2, "verdict": "SUPPORTED"}]}', 1),
    ('{"sentences": [{"id": 1, "verdict": "SUPPORTED"}], "answer": "SUPPORTED"}', 1),
    ('{"sentences": [7, {"verdict": "SUPPORTED", "phrases": [3, null]}], "answer": "PERHAPS"}', 1),
])
def test_an_unreadable_verdict_counts_as_one_and_scores_a_half(reply, unreadable):
    answer = "Paris is the capital of France. Lyon is in France."
    with ScriptedLLM(lambda body: reply) as server:
        found = asyncio.run(detector(server).detect(RAG, answer))
    assert found.stats.unparseable_verdicts == unreadable
    # no verdict: a half, read as a doubt (the calibration counts it as a sentence called UNSUPPORTED)
    assert found.features["worst"] == 0.5
    assert "whole" not in found.features or found.features["whole"] == 0.0
    assert sentences.inputs(found.features, 0.6)["sentence_unsupported"] == 1.0
    assert found.score == pytest.approx(probability("whole" not in found.features, True))
    assert found.factoids == []  # a sentence with no verdict is pointed at by none


def test_entries_without_ids_are_read_by_their_place():
    answer = "Paris is the capital of France. Nice is in Italy."
    reply = json.dumps({"sentences": [{"verdict": "SUPPORTED", "phrases": []},
                                      {"verdict": "UNSUPPORTED", "phrases": ["Italy"]}], "answer": "UNSUPPORTED"})
    with ScriptedLLM(lambda body: reply) as server:
        found = asyncio.run(detector(server).detect(RAG, answer))
    assert found.stats.unparseable_verdicts == 0 and [f.text for f in found.factoids] == ["Italy"]


@pytest.mark.parametrize("entries", [
    [{"id": 2, "verdict": "SUPPORTED", "phrases": []}],
    [{"id": 2, "verdict": "SUPPORTED", "phrases": []}, {"verdict": "SUPPORTED", "phrases": []}],
    [{"id": 2.0, "verdict": "SUPPORTED", "phrases": []}],
])
def test_an_entry_naming_another_sentence_is_never_read_for_this_one(entries):
    """Sentence 1 has no entry of its own: the one in its place names sentence 2, so sentence 1 has no verdict
    (a half), not sentence 2's."""
    answer = "Paris is the capital of France. Nice is in Italy."
    reply = json.dumps({"sentences": entries, "answer": "SUPPORTED"})
    with ScriptedLLM(lambda body: reply) as server:
        found = asyncio.run(detector(server).detect(RAG, answer))
    assert found.stats.unparseable_verdicts == 1
    assert found.features["worst"] == 0.5 and found.features["whole"] == 0.0
    assert found.factoids == []  # sentence 1 has no verdict, sentence 2 is passed


def test_entries_without_ids_fill_the_places_the_numbered_ones_leave():
    answer = "Paris is the capital of France. Nice is in Italy."
    reply = json.dumps({"sentences": [{"verdict": "SUPPORTED"}, {"id": 2, "verdict": "UNSUPPORTED"}],
                        "answer": "UNSUPPORTED"})
    with ScriptedLLM(lambda body: reply) as server:
        found = asyncio.run(detector(server).detect(RAG, answer))
    assert found.stats.unparseable_verdicts == 0
    assert [(f.text, f.label) for f in found.factoids] == [("Nice is in Italy.", "unsupported")]


def test_a_judge_that_fails_fails_the_check():
    with ScriptedLLM(lambda body: error(500)) as server:
        with pytest.raises(LLMError):
            asyncio.run(detector(server).detect(RAG, "Paris is the capital of France."))


LONG = " ".join(f"Town number {i} is in France." for i in range(300))  # 300 sentences


def long_checker(base_url: str, **detector_settings: object) -> Checker:
    config = Config.model_validate({
        "judge": {"model": "openai/scripted", "api_base": base_url, "api_key": "sk-test", "timeout_s": 30,
                  "max_attempts": 1},
        "detector": {"name": "sentences", **detector_settings},
        "policy": {"profiles": {"general": {"on_error": "fail_closed"}}}})
    return Checker(build_detector(config), PolicyEngine(config.policy), config)


def check_request() -> CheckRequest:
    return CheckRequest(body={}, rag=RAG, source="explicit", profile="general", topic="general")


async def decided(checker: Checker, text: str) -> CheckOutcome:
    """The check of `text` and policy's decision on it, as the guard asks for them."""
    request, answer = check_request(), Answer.of_text(text)
    found = await checker.find(request, answer)
    decision = checker.engine.decide(request.profile, request.topic, found.finding, answer.holds())
    return CheckOutcome(decision, found.finding.detection, found.latency_ms)


def test_a_long_answer_is_judged_whole_in_a_bounded_number_of_calls():
    with ScriptedLLM(by_label({"number 123 ": []})) as server:
        outcome = asyncio.run(decided(long_checker(server.base_url), LONG))
    asked = [s for b in server.requests for _, s in asked_sentences(body_user(b))]
    assert len(server.requests) == 25 and max(len(asked_sentences(body_user(b))) for b in server.requests) == 12
    assert sorted(asked) == sorted(f"Town number {i} is in France." for i in range(300))  # each sentence once
    assert outcome.detection is not None
    assert (outcome.detection.settings["judged"], outcome.detection.settings["calls"]) == (300, 25)
    [flagged] = outcome.detection.factoids
    assert flagged.text == "Town number 123 is in France." and outcome.decision.reason is None


def test_a_long_answer_past_max_judge_calls_is_read_as_far_as_the_cap_goes_and_the_rest_fails_as_the_profile_says():
    invented = LONG.replace("Town number 7 is in France.", "Town number 7 is in Spain.")
    with ScriptedLLM(by_label({"Spain": ["Spain"]})) as server:
        capped = asyncio.run(decided(long_checker(server.base_url, max_judge_calls=24), LONG))
        assert len(server.requests) == 24  # the first 288 sentences, then the cap
        caught = asyncio.run(decided(long_checker(server.base_url, max_judge_calls=24), invented))
    assert (capped.decision.action, capped.decision.reason) == ("block", "fail_closed: judge_call_cap")
    assert capped.detection is not None and capped.detection.unchecked_from == LONG.index("Town number 288")
    assert (caught.decision.action, caught.decision.flagged) == ("annotate", True)  # what it read decides
    assert caught.decision.reason == "read in part: judge_call_cap"


def test_the_checks_of_a_growing_answer_read_the_context_and_each_sentence_once_and_plan_as_a_check_alone(
        monkeypatch):
    from morphguard.config import SentencesSettings

    check = sentences.Sentences(llm=None, settings=SentencesSettings())  # type: ignore[arg-type]
    said = " ".join(FRANCE)
    read_sentences, read_contexts = [], []
    report, vocabulary = sentences.sentence_report, sentences.vocabulary
    monkeypatch.setattr(sentences, "sentence_report", lambda a, s, e, k: read_sentences.append(a[s:e]) or report(
        a, s, e, k))
    monkeypatch.setattr(sentences, "vocabulary", lambda texts: read_contexts.append(1) or vocabulary(texts))
    known = sentences.Asked()
    for end in (len(FRANCE[0]), said.index(FRANCE[3]) - 1, len(said)):  # three checks, the answer growing
        assert check.plan(RAG, said[:end], known) == check.plan(RAG, said[:end])
    assert read_contexts == [1] and sorted(read_sentences) == sorted(FRANCE)
