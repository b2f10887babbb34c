from morphguard.detectors.spans import locate

ANSWER = ("Ibuprofen is a common painkiller. Yes, ibuprofen is safe throughout pregnancy, "
          "and it can be bought without a prescription.")


def test_exact_factoid_maps_to_its_own_characters():
    start, end = locate("Ibuprofen is a common painkiller.", ANSWER)
    assert ANSWER[start:end] == "Ibuprofen is a common painkiller"


def test_reworded_factoid_maps_into_the_sentence_it_came_from():
    span = locate("Ibuprofen is safe during the whole pregnancy.", ANSWER)
    assert span is not None
    start, end = span
    assert ANSWER[start:end].startswith("ibuprofen is safe throughout pregnancy")
    assert "painkiller" not in ANSWER[start:end]


def test_resolved_pronoun_still_lands_on_the_right_clause():
    span = locate("Ibuprofen can be bought without a prescription.", ANSWER)
    assert span is not None
    assert "prescription" in ANSWER[span[0]:span[1]]
    assert ANSWER[span[0]:span[1]].startswith("ibuprofen")


def test_unrelated_factoid_is_not_placed():
    assert locate("The Eiffel Tower is in Paris.", ANSWER) is None
