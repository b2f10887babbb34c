"""The fast check's front ends: statements without an LLM, and the context cut to what they are about."""

from morphguard.detectors import focus as focusing
from morphguard.detectors.focus import Focus, focus
from morphguard.detectors.text import content_words, statements


def test_statements_are_sentences_and_list_items_that_state_something():
    answer = ("Based on the provided passages, the meaning of the name Teresa is:\n\n"
              "* In Greek, the meaning of Teresa is \"Reap; from Therasia.\"\n"
              "1. In Italian, it means Harvester. The U.S. form is 3.5 times as common.\n\n"
              "Therefore, I can confidently answer the question.")
    assert statements(answer) == [
        "In Greek, the meaning of Teresa is \"Reap; from Therasia.\"",
        "In Italian, it means Harvester.",
        "The U.S. form is 3.5 times as common.",
    ]
    assert statements("Paris is in France. Lyon is too. Nice is as well.", limit=2) == [
        "Paris is in France.", "Lyon is too."]
    assert statements("") == []


def test_focus_keeps_the_best_match_of_every_claim_within_budget_in_context_order():
    passages = ["Ibuprofen eases back pain. The car park opens at seven. Parking costs two euros.",
                "Paracetamol is preferred in pregnancy. Ibuprofen is avoided in the third trimester."]
    claims = ["Ibuprofen is safe in the third trimester.", "Paracetamol is preferred."]
    kept = focus(claims, passages, budget=100)
    assert kept == ["", "Paracetamol is preferred in pregnancy. Ibuprofen is avoided in the third trimester."]
    wider = focus(claims, passages, budget=140)
    assert wider[0] == "Ibuprofen eases back pain." and wider[1] == kept[1]
    assert focus(claims, passages, budget=0) == passages
    assert focus(claims, passages, budget=10_000) == passages


def test_focus_marks_gaps_between_kept_sentences():
    passage = "Alpha rises early. Beta sleeps late. Gamma rises early too. Delta sleeps."
    assert focus(["Alpha and Gamma rise early."], [passage], budget=45) == [
        "Alpha rises early. … Gamma rises early too."]
    assert focus(["Gamma rises early."], [passage], budget=25) == ["… Gamma rises early too."]


def test_a_claim_of_common_words_is_scored_against_a_bounded_number_of_sentences_and_its_rare_word_still_leads():
    """Thousands of sentences share a claim's common words; the one holding its rare word is still kept, and the
    claim is scored against no more than `CANDIDATES` sentences, not the whole context."""
    filler = [f"The ward opens early on day {n % 7} for the patients who wait." for n in range(3 * focusing.CANDIDATES)]
    needle = "The ward of Dr Okonkwo opens early for the patients."
    passages = [" ".join(filler[:4000]) + " " + needle + " " + " ".join(filler[4000:])]
    context = Focus(passages)
    claim = "Dr Okonkwo's ward opens early for the patients."
    assert len(context._candidates(content_words(claim))) <= focusing.CANDIDATES
    assert len(context._candidates(content_words("The ward opens early for the patients."))) == focusing.CANDIDATES
    assert needle in context.select([claim], budget=200)[0]
