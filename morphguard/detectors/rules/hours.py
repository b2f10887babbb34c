"""Opening hours: what an answer says about when a place is open, read against a record's `hours`. No LLM call.

A business record lists its hours per weekday (`"Monday": "17:0-21:0"`); answers written from it restate them as
days and times ("open Monday to Saturday from 5 PM to 9 PM") and err by stretching a range over a day with other
hours, or over a day the record leaves out. Every word and number of such a claim is in the record, so counting
unsupported words cannot see it. A day listed as `0:0-0:0` counts as closed, as RAGTruth's annotators read it:
on its Data2txt fit half an answer calling such a day closed is never marked, one calling it open is.

In each answer sentence the day expressions (a day, a range "Tuesday to Friday", a list, "weekends", "every day")
and the times (a range "11:30 AM - 8 PM", or one end: "until 2 pm") are paired, days then their times or times then
their days, whichever order pairs more of the sentence. A claim is misstated when
- a time is stated for a day the record keeps closed, or differs from the day's own (a time written without
  AM/PM may be either),
- an opening is stated for a closed day ("open Monday through Sunday"), or a closing for an open one ("closed
  on Mondays"),
- a time range with no day matches none of the record's days,
- some days are said to have longer hours ("extended hours on weekends") than they have, on average, against
  the other days,
- the record has a field for its hours and leaves it empty.

The record is the one `records` reads (`read_records`); the two rules are versioned together, as `records`.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from itertools import accumulate

from morphguard.detectors.rules.records import VERSION, field_evidence, misread, read_records
from morphguard.detectors.rules.registry import Conflict, Context, Reading, Rule, register
from morphguard.detectors.text import DAYS, sentences
from morphguard.models import Evidence

WEEK = frozenset(range(7))
REACH = 200  # characters either side of a day expression in which its clause is looked for
# "every day" forms in lower case only: "Our Daily Bread" is a name.
_DAY = re.compile(r"\b(?:(monday|tuesday|wednesday|thursday|friday|saturday|sunday)s?"
                  r"|(?-i:(Mon|Tues?|Wed|Thu(?:rs?)?|Fri|Sat|Sun))\b\.?"
                  r"|(weekdays?)|((?:the )?weekends?)"
                  r"|(?-i:((?:seven|7) days(?: a week)?|every day|daily|all week)))\b", re.IGNORECASE)
_ABBREVIATIONS = {"mon": 0, "tue": 1, "tues": 1, "wed": 2, "thu": 3, "thur": 3, "thurs": 3, "fri": 4, "sat": 5,
                  "sun": 6}
# A clock time: "11:30", "5 pm", "5:30 p.m.", "noon". A bare number is a time only as one end of a range whose
# other end is written as one ("4 to 10 pm").
_TIME = re.compile(r"(?<![\d.:,$])(\d{1,2})(?::(\d{1,2}))?(?![\d,])(?!\.\d)(?:\s*([ap])(?:\.\s?m\.|\s?m\b))?"
                   r"|\b(noon|midnight)\b", re.IGNORECASE)
_RANGE_JOIN = re.compile(r"\s*(?:-|–|—|to|until|till|through|thru)\s*", re.IGNORECASE)
_DAY_RANGE = re.compile(r"\s*(?:-|–|—|to|through|thru|until)\s*", re.IGNORECASE)
_DAY_LIST = re.compile(r"\s*(?:,|and|&|or|,\s*and|,\s*or)\s*", re.IGNORECASE)
_CLOSE_ONLY = re.compile(r"(?:until|till|closes?|closing|closures?)\s+(?:at\s+)?$", re.IGNORECASE)
_OPEN_ONLY = re.compile(r"(?:opens?|opening)\s+(?:at\s+)?$", re.IGNORECASE)
_CLOSED = re.compile(r"\bclosed\b|\bnot open\b", re.IGNORECASE)
_OPEN = re.compile(r"\bopen|\boperat|\bhours\b|\bserv(?:es|ing)\b", re.IGNORECASE)
_LONGER = re.compile(r"\b(?:extended|longer|later|late)\s+(?:hours|opening|closing)\b"
                     r"|\b(?:opens?|stays? open)\s+(?:later|late|longer)\b", re.IGNORECASE)
_CLAUSE_END = re.compile(r"[;:]|,\s*(?:but|while|with|and)\b|\b(?:but|while|with|except)\b", re.IGNORECASE)


@dataclass(frozen=True)
class Misstated:
    start: int
    end: int
    day: str | None  # the first day the claim gets wrong, e.g. "Monday" (None: a time stated for no day)


@dataclass(frozen=True)
class _Days:
    start: int
    end: int
    days: frozenset[int]


@dataclass(frozen=True)
class _Times:
    start: int
    end: int
    opens: frozenset[int] | None  # the minutes after midnight it may mean (None: not stated)
    closes: frozenset[int] | None


def schedule(hours: Mapping[str, object]) -> dict[int, tuple[int, int] | None]:
    """Each weekday the record lists: its (opening, closing) minutes, or None where it is closed. A day the
    record leaves out is missing."""
    out: dict[int, tuple[int, int] | None] = {}
    for name, value in hours.items():
        if not isinstance(name, str) or name.lower() not in DAYS:
            continue
        times = re.fullmatch(r"\s*(\d{1,2}):(\d{1,2})\s*-\s*(\d{1,2}):(\d{1,2})\s*", str(value))
        if times is None:
            continue
        h1, m1, h2, m2 = (int(g) for g in times.groups())
        opening, closing = (h1 * 60 + m1) % 1440, (h2 * 60 + m2) % 1440
        out[DAYS.index(name.lower())] = None if opening == closing == 0 else (opening, closing)
    return out


def misstated(answer: str, hours: Mapping[int, tuple[int, int] | None], silent: bool = False) -> list[Misstated]:
    """The answer's claims about when the place is open that the record's hours contradict. `silent`: the record
    has a field for its hours and leaves it empty, so every such claim is unsupported."""
    if not hours and not silent:
        return []
    found = []
    for start, end in sentences(answer):
        here = []
        for days, times, closed in _claims(answer, start, end):
            if (wrong := _misstated(days, times, closed, hours, silent)) is not None:
                here.append(wrong)
        found += here + _apart(here, _longer(answer, start, end, hours))
    return sorted(found, key=lambda m: m.start)


def _apart(claims: list[Misstated], more: list[Misstated]) -> list[Misstated]:
    """Those of `more` that overlap none of `claims` (one claim, one conflict), each found in log time: a hostile
    sentence can hold thousands."""
    ordered = sorted(claims, key=lambda m: m.start)
    starts = [m.start for m in ordered]
    reach = list(accumulate((m.end for m in ordered), max))  # the furthest end among the first k
    return [m for m in more if not ((k := bisect_left(starts, m.end)) and reach[k - 1] > m.start)]


def _longer(answer: str, start: int, end: int, hours: Mapping[int, tuple[int, int] | None]) -> list[Misstated]:
    """"Extended hours on weekends" where the days named are open no longer, on average, than the others."""
    length = {day: (h[1] - h[0]) % 1440 or 1440 for day, h in hours.items() if h is not None}
    found = []
    for match in _LONGER.finditer(answer, start, end):
        days = next(_day_groups(answer, match.end(), min(end, match.end() + REACH)), None)
        if days is None or _CLAUSE_END.search(answer, match.end(), days.start):
            continue
        named = [length[d] for d in sorted(days.days) if d in length]
        others = [v for d, v in length.items() if d not in days.days]
        if others and (not named or sum(named) / len(named) <= sum(others) / len(others)):
            found.append(Misstated(match.start(), days.end, DAYS[min(days.days)].title()))
    return found


def _misstated(days: _Days | None, times: _Times | None, closed: bool,
               hours: Mapping[int, tuple[int, int] | None], silent: bool) -> Misstated | None:
    """The claim as a conflict where the record contradicts it, naming the first day it gets wrong; None where it
    does not. A day the record leaves out is closed; a record that leaves its hours empty supports no claim."""
    spans = [p for p in (days, times) if p is not None]
    start, end = min(p.start for p in spans), max(p.end for p in spans)
    if silent:
        return Misstated(start, end, None)
    if days is None:  # a time range with no day: wrong only where no day has it
        assert times is not None and times.opens is not None and times.closes is not None
        fits = any(h is not None and h[0] in times.opens and h[1] in times.closes for h in hours.values())
        return None if fits else Misstated(start, end, None)
    for day in sorted(days.days):
        listed = hours.get(day)
        if closed:
            wrong = listed is not None
        else:
            wrong = listed is None or times is not None and (
                times.opens is not None and listed[0] not in times.opens
                or times.closes is not None and listed[1] not in times.closes)
        if wrong:
            return Misstated(start, end, DAYS[day].title())
    return None


def _claims(answer: str, start: int, end: int) -> Iterator[tuple[_Days | None, _Times | None, bool]]:
    """(days, times, whether the days are said to be closed) for each claim of a sentence."""
    items: list[_Days | _Times] = sorted([*_day_groups(answer, start, end), *_times(answer, start, end)],
                                         key=lambda p: p.start)
    # Days then their times, or times then their days: whichever order pairs more; on a tie, the sentence's own
    by_days, by_times = _pairs(answer, items, True), _pairs(answer, items, False)
    opens_with_days = bool(items) and isinstance(items[0], _Days)
    tie = len(by_days) == len(by_times)
    paired = by_days if len(by_days) > len(by_times) or tie and opens_with_days else by_times
    taken = {id(p) for pair in paired for p in pair}
    for days, times in paired:
        yield days, times, False
    for item in items:
        if id(item) in taken:
            continue
        if isinstance(item, _Days):
            clause = _clause(answer, item, start, end)
            if _CLOSED.search(clause):
                yield item, None, True
            elif _OPEN.search(clause) or len(item.days) == 7:
                yield item, None, False
        elif item.opens is not None and item.closes is not None:
            yield None, item, False


def _pairs(answer: str, items: list[_Days | _Times], days_first: bool) -> list[tuple[_Days, _Times]]:
    """Adjacent (days, times) in the given order, nothing between them that ends a clause."""
    out = []
    i = 0
    while i + 1 < len(items):
        item, following = items[i], items[i + 1]
        if (isinstance(item, _Days) == days_first and isinstance(following, _Days) != days_first
                and not _CLAUSE_END.search(answer, item.end, following.start)):
            out.append((item, following) if days_first else (following, item))
            i += 2
        else:
            i += 1
    return out  # type: ignore[return-value]


def _clause(answer: str, item: _Days, start: int, end: int) -> str:
    """The clause around a day expression, looking at most REACH characters each way (so that a hostile
    sentence of many day names costs time in proportion to its length)."""
    start, end = max(start, item.start - REACH), min(end, item.end + REACH)
    before = max((m.end() for m in _CLAUSE_END.finditer(answer, start, item.start)), default=start)
    after = next((m.start() for m in _CLAUSE_END.finditer(answer, item.end, end)), end)
    return answer[before:after]


def _day_groups(answer: str, start: int, end: int) -> Iterator[_Days]:
    """Day expressions, ranges and lists joined: "Tuesday to Thursday and Saturday" is one group."""
    group: _Days | None = None
    single: int | None = None  # the group's last day when it was named alone: a range may start there
    for match in _DAY.finditer(answer, start, end):
        days = _days_of(match)
        between = answer[group.end:match.start()] if group else ""
        alone = next(iter(days)) if len(days) == 1 else None
        if group and single is not None and alone is not None and _DAY_RANGE.fullmatch(between):
            span = frozenset((single + k) % 7 for k in range((alone - single) % 7 + 1))
            group, single = _Days(group.start, match.end(), group.days | span), None
            continue
        if group and _DAY_LIST.fullmatch(between):
            group = _Days(group.start, match.end(), group.days | days)
        else:
            if group:
                yield group
            group = _Days(match.start(), match.end(), days)
        single = alone
    if group:
        yield group


def _days_of(match: re.Match[str]) -> frozenset[int]:
    name, short, weekday, weekend, _every = match.groups()
    if name:
        return frozenset({DAYS.index(name.lower())})
    if short:
        return frozenset({_ABBREVIATIONS[short.lower()]})
    if weekday:
        return frozenset(range(5))
    if weekend:
        return frozenset({5, 6})
    return WEEK


def _times(answer: str, start: int, end: int) -> Iterator[_Times]:
    """Time ranges, and single times that say only when the place opens or closes."""
    found = [(m.start(), m.end(), t) for m in _TIME.finditer(answer, start, end) if (t := _minutes(m))]
    i = 0
    while i < len(found):
        a_start, a_end, a = found[i]
        if i + 1 < len(found) and _RANGE_JOIN.fullmatch(answer, a_end, found[i + 1][0]):
            b_start, b_end, b = found[i + 1]
            if a[1] or b[1]:  # at least one end written as a clock time
                yield _Times(a_start, b_end, *_meridiem(a, b))
                i += 2
                continue
        lead_start = max(start, a_start - 20)
        lead = answer[lead_start:a_start]
        if a[1] and (said := _CLOSE_ONLY.search(lead) or _OPEN_ONLY.search(lead)):
            closing = said.re is _CLOSE_ONLY
            yield _Times(lead_start + said.start(), a_end, None if closing else a[0], a[0] if closing else None)
        i += 1


def _minutes(match: re.Match[str]) -> tuple[frozenset[int], bool, str | None] | None:
    """(the minutes it may mean, whether it is written as a clock time, its a/p if any); None where it is no time
    of day ("45 minutes")."""
    hour, minute, half, word = match.groups()
    if word:
        return frozenset({720 if word.lower() == "noon" else 0}), True, None
    h, m = int(hour), int(minute or 0)
    clock = minute is not None or half is not None
    if h > 24 or m > 59:
        return None
    if h == 0 or h > 12:  # a 24-hour time ("14:00 pm": its PM a slip)
        return frozenset({(h * 60 + m) % 1440}), clock, None
    if half:
        return frozenset({((h % 12) + (12 if half.lower() == "p" else 0)) * 60 + m}), True, half.lower()
    return frozenset({(h % 12) * 60 + m, (h % 12 + 12) * 60 + m}), clock, None


def _meridiem(a: tuple[frozenset[int], bool, str | None], b: tuple[frozenset[int], bool, str | None]
              ) -> tuple[frozenset[int], frozenset[int]]:
    """A range's two ends, an end without AM/PM reading as the other's where that puts opening first ("7:30 to
    1:30 pm": AM), as the opposite otherwise."""
    (opens, _, a_half), (closes, _, b_half) = a, b
    if a_half is None and b_half is not None and len(opens) == 2:
        close = next(iter(closes))
        same = [t for t in opens if (t >= 720) == (b_half == "p")]
        opens = frozenset(same) if same and same[0] < close else opens - frozenset(same)
    return opens, closes


def _stated(answer: str, context: Context) -> Reading:
    """The hours rule: each claim about opening hours that the record's contradict, named by the first day it gets
    wrong (`hours.Monday`)."""
    records = context.shared(read_records)
    # "hours": null: the record has a place for its hours and leaves it empty
    silent = not records.hours and any(f.name.lower() == "hours" and f.value is None for f in records.fields)
    key = records.hours_key or ("hours" if silent else "")
    found = []
    cited: dict[str, Evidence | None] = {}  # each day's place in the context, looked up once
    for m in misstated(answer, schedule(records.hours), silent):
        fact = f"{key}.{m.day}" if m.day else key
        if fact not in cited:
            cited[fact] = field_evidence(context.passages, fact)
        found.append(Conflict(m.start, m.end, m.start, fact, cited[fact], misread(fact)))
    return Reading(found)


register(Rule(name="hours", read=_stated, version=VERSION, versioned_as="records"))
