import json

from morphguard.detectors.rules import read_all
from morphguard.detectors.rules.hours import misstated, schedule
from tests.detectors.test_grounding import check_with

# Monday 0:0-0:0 reads as closed; Tuesday is left out, so closed as well.
HOURS = {"Monday": "0:0-0:0", "Wednesday": "11:30-20:0", "Thursday": "11:30-20:0", "Friday": "11:30-16:0",
         "Saturday": "11:30-16:0", "Sunday": "10:0-2:0"}
RECORD = json.dumps({"name": "Harbour Deli", "hours": HOURS, "attributes": {"OutdoorSeating": False}})


def wrong(answer: str) -> list[tuple[str, str | None]]:
    return [(answer[m.start:m.end], m.day) for m in misstated(answer, schedule(HOURS))]


def test_the_record_reads_as_minutes_per_day_with_0_0_as_closed():
    assert schedule(HOURS) == {0: None, 2: (690, 1200), 3: (690, 1200), 4: (690, 960), 5: (690, 960), 6: (600, 120)}
    assert schedule({"Monday": "late", "Holiday": "9:0-17:0"}) == {}


def test_hours_that_agree_with_the_record_in_any_common_writing_are_no_conflict():
    assert wrong("It is open from 11:30 AM to 8 PM Wednesday through Thursday, and until 4 p.m. on Fridays and "
                 "Saturdays.") == []
    assert wrong("Hours: Wed-Thu 11:30-20:00, Fri & Sat 11:30 to 4 pm, Sunday 10 am to 2 am.") == []
    assert wrong("On Sunday it opens at 10:00 and stays open until 2:00.") == []  # no AM/PM: either reading
    assert wrong("It is closed on Mondays and Tuesdays.") == []
    assert wrong("The kitchen runs from 11:30 AM to 8 PM.") == []  # no day named: some day has it
    assert wrong("It has 4.5 stars, $14 mimosas and a review from 2022-01-09 19:18:59.") == []  # no times
    assert wrong("Lunch takes 45 to 50 minutes on Fridays.") == []  # no time of day
    # a 24-hour time with a stray PM is read as written
    assert wrong("It is open 11:30 am to 16:00 pm on Fridays and Saturdays.") == []


def test_a_time_or_a_day_the_record_contradicts_is_misstated_with_the_claim_as_its_span():
    # days first, then times first, each sentence paired in the order that pairs most of it
    assert wrong("It opens Wednesday to Saturday from 11:30 AM to 8 PM and on Sunday from 10 AM to 2 AM.") == [
        ("Wednesday to Saturday from 11:30 AM to 8 PM", "Friday")]
    assert wrong("It serves from 11:30 am to 8 pm on Wednesday and Thursday, and until 9 pm on weekends.") == [
        ("until 9 pm on weekends", "Saturday")]
    assert wrong("The hours are 11:30 to 8 on Wednesdays and Thursdays, with Sunday from 10 to 2.") == []
    assert wrong("It is open Monday through Sunday.") == [("Monday through Sunday", "Monday")]
    assert wrong("It is open seven days a week.") == [("seven days a week", "Monday")]
    assert wrong("It is closed on Fridays.") == [("Fridays", "Friday")]
    assert wrong("The kitchen runs from 9 AM to 5 PM.") == [("9 AM to 5 PM", None)]  # no day has it


def test_longer_hours_on_some_days_must_be_longer_than_the_others():
    # the weekend (11:30-16:00, 10:00-02:00) averages 9.25 hours against Wednesday to Friday's 7.5
    assert wrong("It keeps extended hours on weekends.") == []
    assert wrong("It keeps extended hours on Fridays.") == [("extended hours on Fridays", "Friday")]
    # closed that day: one claim, one conflict
    assert wrong("It stays open late on Mondays.") == [("Mondays", "Monday")]


def test_a_record_that_leaves_its_hours_empty_supports_no_claim_about_them():
    record = json.dumps({"name": "Harbour Deli", "hours": None, "attributes": {"WiFi": "free"}})
    found = read_all("It has free WiFi and is open seven days a week, from 9 AM to 5 PM.", [record]).conflicts
    assert [(c.fact, c.at == c.start) for c in found] == [("hours", True)]
    assert read_all("It has free WiFi.", [record]).conflicts == []


def test_names_and_lower_case_words_that_look_like_days_are_not_days():
    assert wrong("Our Daily Bread is open on Wednesdays.") == []  # "Daily" in a name
    assert wrong("Guests sat outside on Sunday.") == []  # nothing said about opening
    assert wrong("The owner said they would wed in May.") == []


def test_a_misstated_time_is_a_record_conflict_grounding_points_at_exactly():
    answer = "Harbour Deli is open daily from 11:30 AM to 8 PM. It has no outdoor seating."
    [conflict] = read_all(answer, [RECORD]).conflicts
    assert answer[conflict.start:conflict.end] == "daily from 11:30 AM to 8 PM" and conflict.at == conflict.start
    assert conflict.fact == "hours.Monday" and conflict.evidence.text == '"Monday": "0:0-0:0"'
    result = check_with([RECORD], answer)
    assert result.features["record_conflicts"] == 1
    assert [f.text for f in result.factoids] == ["daily from 11:30 AM to 8 PM"]


def test_hours_are_read_only_where_one_record_lists_them():
    other = json.dumps({"name": "Pier Cafe", "hours": {"Monday": "8:0-12:0"}})
    assert read_all("It is open on Monday from 8 AM to noon.", [RECORD, other]).conflicts == []
    assert read_all("It is open on Monday from 8 AM to noon.", [other]).conflicts == []
    assert len(read_all("It is open on Monday from 9 AM to noon.", [other]).conflicts) == 1


def test_a_hostile_sentence_of_80_000_day_and_time_expressions_is_read_to_its_end():
    # each look around an expression is bounded (REACH, one pass per pairing order), so the cost grows with the
    # length; a timing is a benchmark's to measure, not a test's
    answer = "It is open " + ", ".join(["Monday", "Friday to Sunday", "11 am - 2 pm", "late on Mondays"] * 20_000) + "."
    assert len(wrong(answer)) >= 1
