import asyncio

from morphguard.config import Config
from morphguard.detectors import build_detector
from morphguard.detectors.grounding import ungrounded
from morphguard.models import RagInput

CONTEXT = ["Ibuprofen is contraindicated in the third trimester of pregnancy. Doses up to 1,200 mg a day are usual."]


def check(answer: str):
    detector = build_detector(Config(), name="grounding")
    return asyncio.run(detector.detect(RagInput(question="Is ibuprofen safe?", passages=CONTEXT), answer))


def test_rewording_of_the_context_is_grounded():
    result = check("According to the passages, ibuprofen is contraindicated during the third trimester; "
                   "usual doses are 1200 mg daily... up to three trimesters.")
    assert result.settings["unsupported_words"] == ["daily", "three"]  # "3" is nowhere in the context


def test_invented_numbers_and_names_are_listed_with_their_places():
    answer = "Ibuprofen is safe. Professor Jones advises 2,400 mg."
    result = check(answer)
    assert result.settings["unsupported_words"] == ["safe", "Professor", "Jones", "advises", "2,400"]
    assert result.features["unsupported_numbers"] == 1 and result.features["unsupported_names"] == 1
    assert [answer[f.start:f.end] for f in result.factoids] == ["Ibuprofen is safe.",
                                                                "Professor Jones advises 2,400 mg."]
    assert result.score > check("Ibuprofen is safe.").score > check("Ibuprofen is contraindicated.").score == 0.0


def test_sentences_report_their_content_words():
    reports = ungrounded("It is rare. Ibuprofen is usual.", CONTEXT)
    assert [(r.content, [w.text for w in r.unsupported]) for r in reports] == [(1, ["rare"]), (2, [])]


def test_a_copied_sentence_with_its_polarity_number_or_hedge_changed_is_counted():
    context = ["The clinic may open on Sundays. It does not take walk-ins. It has 12 beds."]
    same = check_with(context, "The clinic may open on Sundays. It does not take walk-ins. It has 12 beds.")
    changed = check_with(context, "The clinic opens on Sundays. It does take walk-ins. It has 14 beds.")
    keys = ("negation_mismatch", "number_mismatch", "hedge_dropped")
    assert [same.features[k] for k in keys] == [0, 0, 0]
    assert [changed.features[k] for k in keys] == [1, 1, 1]


def check_with(context, answer):
    detector = build_detector(Config(), name="grounding")
    return asyncio.run(detector.detect(RagInput(question="q", passages=context), answer))
