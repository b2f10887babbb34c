import json

from morphguard.detectors.rules import read_all
from morphguard.detectors.rules.records import MAX_CHECKS, MAX_FIELDS, MAX_RECORD_CHARS, fields, misstated_fields
from tests.detectors.test_grounding import check_with

RECORD = json.dumps({
    "name": "Harbour Deli", "address": "12 State Street",
    "hours": {"Monday": "9:0-17:0", "Tuesday": "9:0-17:0", "Saturday": "10:0-14:0"},
    "attributes": {
        "OutdoorSeating": False, "RestaurantsTakeOut": True, "RestaurantsReservations": False,
        "RestaurantsGoodForGroups": None, "WiFi": "u'no'",
        "BusinessParking": {"street": False, "valet": True},
        "Ambience": {"trendy": False, "casual": True},
    },
})


def stated(answer: str) -> list[tuple[str, str]]:
    """Each field the answer states against the record, with the words that mention it."""
    return [(name.rsplit(".", 1)[-1], answer[start:end])
            for start, end, name, _ in misstated_fields(answer, [RECORD], fields([RECORD]))]


def test_field_names_lose_the_prefix_several_share_and_keep_their_words():
    by_name = {f.name: f for f in fields([RECORD])}
    assert by_name["attributes.RestaurantsTakeOut"].words == ("tak", "out")
    assert by_name["attributes.RestaurantsTakeOut"].whole == "takeout"
    assert by_name["attributes.OutdoorSeating"].words == ("outdoor", "seat")
    assert by_name["attributes.WiFi"].value is False  # the string "no" reads as no
    assert by_name["attributes.RestaurantsGoodForGroups"].value is None
    assert "name" not in {f.name for f in fields([RECORD])}  # a string that is not yes/no is no field


def test_the_rule_points_at_the_claim_that_mentions_the_field_and_lists_it_where_the_mention_is():
    answer = "Harbour Deli offers outdoor seating and takeout."
    [conflict] = read_all(answer, [RECORD]).conflicts
    assert answer[conflict.start:conflict.end] == "Harbour Deli offers outdoor seating"
    assert answer[conflict.at:].startswith("outdoor seating") and conflict.fact == "attributes.OutdoorSeating"
    assert conflict.reason == "states the record's field 'attributes.OutdoorSeating' otherwise than the record"


def test_a_field_stated_against_its_value_is_a_conflict_at_the_mention():
    assert stated("Harbour Deli offers outdoor seating and takeout.") == [("OutdoorSeating", "outdoor seating")]
    assert stated("You can book a table, and they take reservations.") == [("RestaurantsReservations", "reservations")]
    assert stated("The mood is trendy.") == [("trendy", "trendy")]
    assert stated("It does not offer take-out.") == [("RestaurantsTakeOut", "take-out")]


def test_what_agrees_with_the_record_is_no_conflict():
    assert stated("There is no outdoor seating, but take-out is available.") == []
    assert stated("Outdoor seating is not available and reservations are not accepted.") == []
    assert stated("The ambience is not trendy, hipster, or loud; it is casual.") == []  # a negated list
    assert stated("It does not offer WiFi, and valet parking is offered.") == []
    assert stated("Parking: the street, and outdoor seating are not options.") == []  # a list closed by "are not"
    assert stated("It has valet parking and does not offer WiFi.") == []
    assert stated("It has outdoor seating and does not offer WiFi.") == [("OutdoorSeating", "outdoor seating")]


def test_a_field_the_record_leaves_empty_is_unsupported_either_way():
    assert stated("It is good for groups.") == [("RestaurantsGoodForGroups", "good for groups")]


def test_saying_the_record_is_silent_on_a_field_claims_nothing_about_it():
    assert stated("Whether it is good for groups is not mentioned in the data.") == []
    assert stated("The data does not include outdoor seating or whether it is good for groups.") == []
    # "does not provide" states the field; a turn of the sentence starts a claim of its own
    assert stated("It does not provide take-out.") == [("RestaurantsTakeOut", "take-out")]
    assert stated("Groups are unknown, but it offers outdoor seating.") == [("OutdoorSeating", "outdoor seating")]


def test_a_capitalised_word_is_a_name_not_a_lower_case_field():
    assert stated("The deli is at 12 State Street.") == []
    assert stated("Parking is on the street.") == [("street", "street")]


def test_open_every_day_where_the_record_lists_fewer_days():
    # the first day the claim gets wrong names the field, and the whole claim is the span
    answer = "It is open seven days a week."
    assert [(c.fact, answer[c.start:c.end]) for c in read_all(answer, [RECORD]).conflicts] == [
        ("hours.Wednesday", "seven days a week")]
    every = json.dumps({"hours": {day: "9:0-17:0" for day in
                                  ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")}})
    assert read_all("It is open seven days a week.", [every]).conflicts == []


def test_prose_and_oversized_or_broken_json_are_no_record():
    assert read_all("It offers outdoor seating.", ["The deli has outdoor seating."]).conflicts == []
    assert read_all("It offers outdoor seating.", ['{"OutdoorSeating": false, ']).conflicts == []
    huge = json.dumps({"OutdoorSeating": False, "pad": "x" * MAX_RECORD_CHARS})
    assert read_all("It offers outdoor seating.", [huge]).conflicts == []
    assert read_all("It offers outdoor seating.", ["[" * 50_000 + "]" * 50_000]).conflicts == []  # past the parser


def test_a_hostile_record_and_answer_cost_a_bounded_number_of_looks():
    names = [f"W{i}" for i in range(60)]  # every pair of 60 words a field: each sentence mentions all 1,770
    record = json.dumps({f"{a}{b}": False for a in names for b in names if a < b})
    answer = (" ".join(name.lower() for name in names) + ". ") * 100
    found = read_all(answer, [record]).conflicts
    assert 0 < len(found) <= MAX_CHECKS
    assert len(fields([json.dumps({f"F{i}x": True for i in range(2 * MAX_FIELDS)})])) == MAX_FIELDS


def test_grounding_scores_and_shows_a_record_conflict_with_the_field_as_evidence():
    answer = "Harbour Deli is central. Since 2019, it offers outdoor seating and a loyal following."
    result = check_with([RECORD], answer)
    assert result.features["record_conflicts"] == 1 and result.flagged
    # on a record, only the claim that states the field is pointed at (its clause up to the "and" that joins
    # another claim), not the unsupported words around it
    [factoid] = result.factoids
    assert factoid.label == "contradicted" and factoid.text == "it offers outdoor seating"
    assert factoid.evidence[0].text == '"OutdoorSeating": false'
    assert result.features["unsupported"] >= 3  # "central", "2019", "loyal", ... still count
    assert check_with([RECORD], "Harbour Deli has no outdoor seating.").features["record_conflicts"] == 0


def test_a_record_beside_prose_does_not_make_the_context_a_record():
    prose = "Harbour Deli is a family business. It has no garden."
    answer = "It has outdoor seating."
    alone, mixed = check_with([RECORD], answer), check_with([prose, RECORD], answer)
    assert alone.features["record_fields"] > 0
    # the record's conflict still counts, but the prose is read as prose: a JSON passage slipped into a context
    # must not switch the combined check to the path that asks no judge
    assert mixed.features["record_fields"] == 0 and mixed.features["record_conflicts"] == 1
