import math
import random

import pytest

from morphguard.detectors.alignment import (
    DIFF_LIMIT,
    MAX_COMPARED,
    Context,
    _Words,
    conflicts,
    quotes_context,
    strongest,
)
from morphguard.detectors.text import content_keys
from morphguard.errors import CheckTooLargeError

CONTEXT = ["Ibuprofen is contraindicated in the third trimester of pregnancy. Doctor Lee saw 40 patients in May. "
           "Paracetamol is usually preferred for pain. Doctor Kim saw 25 patients in June."]


def kinds(answer: str) -> list[str]:
    return kinds_in(answer, CONTEXT)


def kinds_in(answer: str, context: list[str]) -> list[str]:
    return sorted(c.kind for c in conflicts(answer, context))


def test_a_faithful_copy_or_a_loose_paraphrase_has_no_conflict():
    assert kinds("Ibuprofen is contraindicated in the third trimester of pregnancy.") == []
    assert kinds("Doctor Lee saw 40 patients in May, and paracetamol is usually preferred.") == []
    assert kinds("Pain relief in general was discussed.") == []  # copies nothing: not this check's business


def test_each_kind_of_change_to_a_copied_sentence_is_found():
    assert kinds("Ibuprofen is not contraindicated in the third trimester of pregnancy.") == ["negation"]
    assert kinds("Doctor Lee saw 25 patients in May.") == ["number"]  # 25 is the context's, from elsewhere
    assert kinds("Doctor Kim saw 40 patients in May.") == ["name"]
    assert kinds("Paracetamol is preferred for pain.") == ["qualifier"]


def test_the_strength_is_how_closely_the_sentence_copies_its_source():
    close = strongest(conflicts("Ibuprofen is not contraindicated in the third trimester of pregnancy.", CONTEXT))
    loose = strongest(conflicts("Ibuprofen is not contraindicated in the trimester, which matters a lot for "
                                "women and their families.", CONTEXT))
    assert close["negation"] == 1.0 and 0 < loose["negation"] < close["negation"]
    assert close["number"] == 0.0


def test_a_list_marker_is_no_number_and_the_evidence_is_where_the_source_stands():
    [conflict] = conflicts("Steps:\n1. Doctor Lee saw 41 patients in May.", ["Intro.", *CONTEXT])
    assert conflict.kind == "number"
    assert conflict.evidence.passage == 2 and CONTEXT[0][conflict.evidence.start:conflict.evidence.end] == (
        "Doctor Lee saw 40 patients in May.")


def test_a_copy_that_renumbers_a_list_or_cites_its_source_changes_no_number():
    """RAGTruth's contexts number their steps ("1  Preheat the oven ..."), and answers renumber them and cite the
    passage they copied. Neither is a claim; a number put in place of another still is, wherever the copy stands."""
    steps = ["1  Preheat oven to 350 degrees F (175 degrees C). 4. Bake the fillets for 15 minutes."]
    assert conflicts("2. Preheat the oven to 350 degrees F (175 degrees C) (Passage 2).", steps) == []
    assert conflicts("Bake the fillets for 15 minutes (step 3).", steps) == []
    assert [c.kind for c in conflicts("Bake the fillets for 20 minutes (step 4).", steps)] == ["number"]
    assert [c.kind for c in conflicts("Preheat oven to 375 degrees F (175 degrees C).", steps)] == ["number"]


def test_a_number_that_opens_a_sentence_is_a_claim_unless_it_numbers_a_list_item():
    """A list item's number has a shape ("3.", "3)", "3" and two spaces, "3-" or "3" before a capital); a sentence
    that opens with its claim has none, and changing that number is a changed copy like any other."""
    seen = ["40 patients were seen by the nurses in May. The clinic opened 25 beds."]
    assert [c.kind for c in conflicts("25 patients were seen by the nurses in May.", seen)] == ["number"]
    assert conflicts("40 patients were seen by the nurses in May.", seen) == []
    steps = ["1  Preheat oven to 350 degrees F. 5 cups of flour are sifted."]
    for item in ("2  Preheat", "2-Preheat", "2 Preheat", "2Preheat", "2) Preheat", "2. Preheat"):
        assert conflicts(item + " oven to 350 degrees F.", steps) == [], item


def test_an_answer_of_whole_context_sentences_as_written_quotes_it():
    context = ["The drug is safe in the third trimester. Some patients feel dizzy.", "1. Take it with food.\n2. Rest."]
    assert quotes_context("The drug is safe in the third trimester.", context)
    assert quotes_context("Based on the passages:\n- take it with food\n- Some patients feel dizzy!", context)
    # a changed word, a sentence cut short, a fragment whose rightness depends on the question: no quote
    assert not quotes_context("The drug is not safe in the third trimester.", context)
    assert not quotes_context("The drug is safe.", context)
    assert not quotes_context("third trimester", context)
    assert not quotes_context("The drug is safe in the third trimester. It cures colds.", context)


def test_a_verdict_set_before_a_quote_is_no_quote():
    """An answer that quotes its context is never judged, so whatever else it says would pass unread: a bare "Yes."
    or "No.", a short claim, or a claim dressed as an intro with a colon."""
    context = ["Ibuprofen is a nonsteroidal anti-inflammatory drug. "
               "Ibuprofen should be avoided in the third trimester."]
    quote = "Ibuprofen is a nonsteroidal anti-inflammatory drug."
    assert quotes_context("Based on the passages:\n" + quote, context)
    for verdict in ("Yes.", "No.", "It is safe.", "Ibuprofen is safe in the third trimester:", "Not in pregnancy, no."):
        assert not quotes_context(verdict + "\n" + quote, context), verdict
        assert not quotes_context(quote + " " + verdict, context), verdict


def test_a_negation_or_a_qualifier_counts_only_about_what_the_copy_keeps():
    """A copy of less is no change: a negation or a hedge that stood in the part of the sentence the answer left out,
    a hedge moved within the sentence, or a negation that the context states of the same word elsewhere. The same
    words dropped or added about what the copy keeps still are."""
    court = ["Laying down tracks for their album in Los Angeles, the sisters could not be further from their "
             "hometown of Mogadishu. The drummer died after his car hit a mailbox and a tree. He was not restrained "
             "at the time of the crash. Bake the fish for about 15 minutes, or until it flakes easily."]

    def found(answer: str) -> list[str]:
        return kinds_in(answer, court)

    assert found("The sisters are laying down tracks for their album in Los Angeles.") == []
    assert found("The sisters could be further from their hometown of Mogadishu.") == ["negation"]
    assert found("The drummer was not restrained and died after his car hit a mailbox and a tree.") == []
    assert found("The drummer did not die after his car hit a mailbox and a tree.") == ["negation"]
    assert found("Bake the fish until it flakes easily, about 15 minutes.") == []
    assert found("Bake the fish for roughly 15 minutes, or until it flakes easily.") == []  # hedged otherwise
    assert found("Bake the fish for 15 minutes, or until it flakes easily.") == ["qualifier"]


def test_about_or_may_is_no_qualifier_where_it_narrows_no_number():
    asked = ["Patients asked about the side effects of the drug in some clinics. The report comes out May 5."]
    assert kinds_in("Patients asked the side effects of the drug in some clinics.", asked) == []
    assert kinds_in("Patients asked about the side effects of the drug on some clinics.", asked) == []
    assert kinds_in("The report comes out 5.", asked) == []
    assert kinds_in("Patients asked about the side effects of the drug in clinics.", asked) == ["qualifier"]


def test_a_name_in_another_form_or_a_number_moved_within_the_copy_is_no_change():
    show = ["By a vote of 7-0, Mecole Hayes was evicted from the house. The office of Governor Josh Shapiro settled "
            "the claim for the aide."]
    assert kinds_in("In season 25, Mecole Hayes was evicted from the house by a vote of 7-0.", show) == []
    assert kinds_in("Governor Josh Shapiro's office settled the claim for the aide.", show) == []
    assert kinds_in("In season 25, Mecole Hayes was evicted from the house by a vote of 6-1.", show) == ["number"]
    assert kinds_in("The office of Governor Tom Wolf settled the claim for the aide.", show) == ["name"]


def test_a_negation_added_to_what_the_copied_sentence_states_is_a_change_whatever_else_the_context_negates():
    """Another sentence's negation of a word makes an added one the context's own only where the copied sentence does
    not hold that word: a negation of the copied sentence's own claim, a second negation, or one that ends its clause
    changes the claim."""
    laundry = ["The bag probably won't melt unless the heat is high, but if it does, it won't cause damage. "
               "They are therefore not less advantaged in school. He has been subject to the law all his life. "
               "He is not subject to the new rule."]
    assert kinds_in("The bag probably won't melt unless the heat is high, but if it does not, it won't cause damage.",
                    laundry) == ["negation"]
    assert kinds_in("They are not therefore not less advantaged in school.", laundry) == ["negation"]
    assert kinds_in("They are therefore not less advantaged in school.", laundry) == []
    assert kinds_in("He has not been subject to the law all his life.", laundry) == ["negation"]


def test_a_sentence_past_the_limit_is_compared_in_runs_and_a_hostile_one_does_not_stall_the_check():
    """The word diff costs the cube of a repetitive sentence's length (4,000 such words took ten minutes whole), so a
    sentence longer than `DIFF_LIMIT` words is compared in runs, each against the stretch of the source it copies. A
    change is still found there, and the source around the copy is no change. Up to the limit, a sentence is compared
    whole."""
    kettles = " ".join(f"the {colour} kettle costs {price} dollars and ships within {price % 7 + 1} days"
                       for price, colour in enumerate(["amber", "green", "grey", "pink", "white", "black"] * 10))
    catalogue = ["The catalogue lists " + kettles + " while the blue kettle is not safe for children and the red "
                 "kettle is safe for adults " + kettles]  # one "sentence" of 1,300 words, as a scraped list may be
    assert kinds_in("The red kettle is safe for adults.", catalogue) == []
    assert kinds_in("The blue kettle is not safe for children and the red kettle is safe for adults.", catalogue) == []
    assert kinds_in("The blue kettle is safe for children and the red kettle is safe for adults.",
                    catalogue) == ["negation"]
    assert kinds_in("The pink kettle costs 3 dollars and ships within 4 days.", catalogue) == []
    assert kinds_in("The pink kettle costs 7 dollars and ships within 4 days.", catalogue) == ["number"]

    # an answer padded into one sentence of 400 words, which copies the context's sentences one by one
    museum = ["The museum opens at nine. " + " ".join(f"Room {i} holds {i} paintings by local artists." for i in
                                                      range(50)) + " The cafe is not open on Mondays."]
    rooms = ", ".join(f"room {i} holds {i} paintings by local artists" for i in range(50))
    assert kinds_in(f"The museum opens at nine, {rooms} and the cafe is not open on Mondays.", museum) == []
    assert kinds_in(f"The museum opens at nine, {rooms} and the cafe is open on Mondays.", museum) == ["negation"]

    # repetitive text that stalled the whole diff: in runs the copy holds "only" half as often as its source
    context = ["The drug is " + "only " * 4_000 + "safe for adults."]
    assert kinds_in("The drug is " + "usually only " * 2_000 + "safe for adults.", context) == ["qualifier"]
    near = DIFF_LIMIT - 10
    assert kinds_in("The drug is " + "only " * (near - 1) + "safe for adults.",
                    ["The drug is " + "only " * near + "safe for adults."]) == ["qualifier"]


def test_a_capital_that_opens_a_sentence_a_line_or_a_clause_after_a_colon_is_no_name():
    """Names are told from sentence openings by looking back over white space only: a search of everything before
    each capitalised word grows with the square of their number (benchmarks/alignment_cost.py)."""
    read = _Words.of("Lee met Kim. Then Park came:\n  Choi left; Moon stayed\nand Song too")
    assert read.tokens[2] == "kim" and read.tokens[4] == "park" and read.tokens[11] == "song"
    assert read.names == {2, 4, 11}


def test_a_negation_folded_into_a_word_that_means_it_is_no_change():
    """"Do not become used to it" and "prevent it becoming used to it" say the same; so do "it is unclear" and "he
    does not know". A negation added or dropped without such a word still counts."""
    hawk = ["Move the plastic hawk often, so the birds do not become used to the plastic hawk. It is unclear how long "
            "the troops can hold the line."]
    assert kinds_in("Move the plastic hawk often to prevent the birds from becoming used to the plastic hawk.",
                    hawk) == []
    assert kinds_in("He does not know how long the troops can hold the line.", hawk) == []
    assert kinds_in("Move the plastic hawk often, so the birds become used to the plastic hawk.", hawk) == ["negation"]
    assert kinds_in("It is unclear how long the troops cannot hold the line.", hawk) == ["negation"]


def test_what_a_sentence_about_the_passages_denies_is_no_negated_copy_but_its_numbers_are_compared():
    oven = ["The bottom drawer on some ovens can be used to warm food. Preheat the oven to 175 degrees."]
    assert kinds_in("Passage 1 says the bottom drawer can not be used to warm food.", oven) == []
    assert kinds_in("The bottom drawer on some ovens can not be used to warm food.", oven) == ["negation"]
    assert kinds_in("Preheat the oven to 180 degrees (Passage 2).", oven + ["It takes 180 seconds."]) == ["number"]


def test_a_name_counts_where_one_short_edit_swaps_it_or_the_context_never_uses_it():
    """A swap replaces a name in a short stretch. A long stretch rewritten around a name the context gives elsewhere
    joins facts; a day dropped for a name, or a name put in its initials, changes nobody."""
    news = ["The FBI charged a Philadelphia woman on Thursday with trying to travel overseas to join the group. "
            "Keonna Thomas, 30, posted messages online. Officials in the United States said the plan was known. "
            "Blue Bell ice cream closed one of its plants over the discovery of listeria."]

    def found(answer: str) -> list[str]:
        return kinds_in(answer, news)

    assert found("The FBI charged a Philadelphia woman, Keonna Thomas, with trying to travel overseas to join the "
                 "group.") == []
    assert found("Officials in the US said the plan was known.") == []
    assert found("Blue Thomas ice cream closed one of its plants over the discovery of listeria.") == ["name"]
    assert found("The FBI charged a Philadelphia woman on Friday with trying to travel overseas to join the "
                 "group.") == ["name"]
    # a long stretch rewritten: only a name the context never uses is a change
    assert found("Blue Bell, whose messages online Keonna Thomas posted, closed one of its plants over the discovery "
                 "of listeria.") == []
    assert found("Officials from Ottawa, speaking for Canada, said the plan was known.") == ["name"]


def test_over_a_number_hedges_as_more_than_does():
    cases = ["The department has prosecuted more than 30 cases in the past 18 months."]
    assert kinds_in("The department has prosecuted over 30 cases in the past 18 months.", cases) == []
    assert kinds_in("The department has prosecuted 30 cases in the past 18 months.", cases) == ["qualifier"]


def test_a_copy_is_found_among_the_few_sentences_holding_its_rarest_words():
    """Every one of 2,000 context sentences shares words with the copy; it is compared with the one holding its
    rarest word, whose share no other sentence could reach, and no other."""
    context = Context([" ".join(f"The kettle number {n} costs {1000 + n} dollars." for n in range(2000))])
    assert context.copied("The kettle number 1500 costs 2500 dollars.") == (1500, 1.0)
    assert context.compared == 1
    # a sentence sharing only common words still finds the first of its best copies
    assert context.copied("The kettle costs dollars.") == (0, 1.0)


def test_the_best_copy_is_the_one_comparing_with_every_sentence_would_find():
    """The candidates read rarest word first find the sentence a comparison with all of them finds (first on a tie)."""
    rng = random.Random(7)
    words = "kettle amber green price costs dollars seven lamp blue shade tall wide".split()
    for _ in range(300):
        text = " ".join(" ".join(rng.choices(words, k=rng.randint(1, 6))).capitalize() + "."
                        for _ in range(rng.randint(1, 30)))
        claim = " ".join(rng.choices(words, k=rng.randint(1, 6)))
        context = Context([text])
        keys = frozenset(content_keys(claim))
        found = context.copied(claim)
        if found is None:
            continue
        weights = {k: math.log(1 + context.sentences / context.frequency[k]) for k in context.frequency}
        shares = [math.fsum(weights[k] for k in context.held[i] & keys) for i in range(len(context.texts))]
        assert shares[found[0]] == max(shares) and shares.index(max(shares)) == found[0]


def test_an_alignment_past_its_bound_of_comparisons_is_refused_not_cut_short():
    """Context sentences made of the same common words make every answer sentence read all of them: past
    MAX_COMPARED the check is refused rather than left part-read."""
    sentences = 4_000
    passages = [" ".join(f"Alpha {'beta' if n % 2 else 'gamma'} {n}." for n in range(sentences))]
    answer = " ".join(["Alpha beta gamma."] * (MAX_COMPARED // sentences + 2))
    with pytest.raises(CheckTooLargeError, match="comparisons"):
        conflicts(answer, passages)
    assert conflicts(" ".join(["Alpha beta gamma."] * 3), passages) == []  # within the bound: compared whole
