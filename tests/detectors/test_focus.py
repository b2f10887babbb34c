"""The fast check's front ends: statements without an LLM, and the context cut to what they are about."""

from morphguard.detectors.focus import focus
from morphguard.detectors.text import statements


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
