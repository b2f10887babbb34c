"""Structured records: what an answer states against a yes/no field of a JSON context. No LLM call.

An answer written from a record such as `{"OutdoorSeating": false, "Ambience": {"trendy": false}}` errs most
often by stating the opposite of a field ("offers outdoor seating", "a trendy spot") or a field the record
leaves empty (`null`). Every word of such a claim is in the context, so `grounding` cannot see it; the field's
name and value can. A field is mentioned where an answer sentence uses all the words of its name (camel humps,
without a prefix several fields share, such as `Restaurants` in `RestaurantsTakeOut`), and the mention is
negative when a negation stands near it in the same clause. A mention is a conflict when its polarity
disagrees with the value, or when the value is null.

The records a context holds are read once per check (`read_records`), for this rule and for `hours`, which reads
opening hours against the record's.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from morphguard.detectors.rules.registry import Conflict, Context, Reading, Rule, register
from morphguard.detectors.text import DAYS, HUMP, NEGATIONS, keys, sentences
from morphguard.models import Evidence

# Of the reading of records and of the rules here and in `hours`, which are versioned together (the hours rule
# reads the records as read here). A change makes earlier eval results stale.
VERSION = 2

# Bounds on what a hostile context can make this cost (it runs on every checked answer): a context larger than
# MAX_RECORD_CHARS is not read as a record, only the first MAX_FIELDS distinct fields are kept, and at most
# MAX_CHECKS places where an answer uses a field's word are looked at; what was found by then stands.
MAX_RECORD_CHARS = 200_000
MAX_DEPTH = 12
MAX_FIELDS = 1_000
MAX_CHECKS = 20_000
# Words and the punctuation that ends a clause, for finding a mention and the negation that governs it.
PIECE = re.compile(r"[^\W_]+(?:['’][^\W_]+)?|[,;:()]")  # "take-out": two words
CLAUSE_ENDS = frozenset({",", ";", ":", "(", ")", "but", "however", "while", "although", "though", "whereas",
                         "yet", "except"})
CLAUSE_MARKS = ",;:.!?\n"
CLAIM_JOINS = re.compile(r"\s(?:and|with)\s", re.IGNORECASE)  # where a clause goes on to another claim
OPENS_RECORD = re.compile(r"\s*[{\[]")
LIST_JOINS = frozenset({"and", "or", "nor"})
NEGATIVE = NEGATIONS | {"lack", "lacks", "lacking", "unavailable", "absent", "nor", "neither"}
REACH_BACK = 6  # words between a negation and the mention it governs ("does not have any outdoor seating")
REACH_AHEAD = 6  # "garage, street, and valet parking are not"
BE = frozenset({"is", "are", "was", "were", "be", "been"})
BE_NOT = frozenset({"isn't", "aren't", "wasn't", "weren't"})
UNAVAILABLE = frozenset({"unavailable", "absent", "lacking"})
# A statement that the record is silent on a field ("reservations are not mentioned", "the data does not include
# WiFi or parking") claims nothing about it; "does not provide WiFi" does, so "provide" is not among the verbs.
UNSAID = re.compile(r"\b(?:is|are|was|were|be)\s+not\s+(?:mentioned|specified|listed|stated|given|indicated|disclosed"
                    r"|known|clear)\b|\b(?:does|do|did)\s*(?:not|n't)\s+(?:mention|include|specify|state|indicate|list"
                    r"|say)\b|\bno\s+(?:information|mention|details?|indication)\b|\bunknown\b|\bunclear\b"
                    r"|\bunspecified\b", re.IGNORECASE)
# Where a sentence turns to another claim: what is said to be unknown before it says nothing about what follows.
TURNS = re.compile(r"\b(?:but|however|while|although|though|whereas|yet)\b|;", re.IGNORECASE)
FALSE_WORDS = frozenset({"no", "none", "false"})
TRUE_WORDS = frozenset({"yes", "true", "free", "paid"})


@dataclass(frozen=True)
class Field:
    name: str  # its path in the record, e.g. attributes.Ambience.trendy
    words: tuple[str, ...]  # the keys (words.keys) an answer must use to mention it
    whole: str  # the same words run together, as one key ("takeout")
    value: bool | None  # None: the record leaves it empty
    capitalised: bool  # its name starts with a capital, so an answer may write it so mid-sentence


@dataclass(frozen=True)
class Records:
    """The JSON records of a context, as the record rules read them."""

    fields: list[Field]  # their yes/no fields
    hours: dict[str, object]  # opening hours by weekday, where a single record lists any (whose, else, is unclear)
    hours_key: str  # the key those hours sit under
    only: bool  # every passage that says anything is a JSON record: no prose beside them


def _records(passages: list[str]) -> Iterator[object]:
    for passage in passages:  # on every checked answer: prose is told apart without copying it
        if len(passage) <= MAX_RECORD_CHARS and OPENS_RECORD.match(passage):
            try:
                yield json.loads(passage)
            except (ValueError, RecursionError):  # RecursionError: arrays nested deeper than the parser goes
                continue


def _leaves(node: object, path: tuple[str, ...], depth: int = 0) -> Iterator[tuple[tuple[str, ...], object]]:
    if depth > MAX_DEPTH:
        return
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, (*path, str(key)), depth + 1)
    elif isinstance(node, list):
        for value in node:
            yield from _leaves(value, path, depth + 1)
    else:
        yield path, node


def _truth(value: object) -> tuple[bool, bool | None]:
    """(whether the value reads as yes/no/empty, and which)."""
    if value is None or isinstance(value, bool):
        return True, value
    if isinstance(value, str):
        plain = value.strip().strip("'\"").lower().removeprefix("u'").strip("'")
        if plain in FALSE_WORDS:
            return True, False
        if plain in TRUE_WORDS:
            return True, True
    return False, None


def fields(passages: list[str]) -> list[Field]:
    """The yes/no fields of every JSON record in the context."""
    return read_records(passages).fields


def _read(records: list[object]) -> tuple[list[Field], dict[str, object], str]:
    """The records' yes/no fields, the opening hours by weekday (only where a single record lists any: whose
    hours a claim is about is unclear otherwise), and the key those hours sit under."""
    each = [[(path, value) for path, value in _leaves(record, ()) if path] for record in records]
    leaves = [leaf for record in each for leaf in record]
    humps = {path[-1]: HUMP.findall(path[-1]) for path, _ in leaves}
    # A first hump that begins several names is a namespace (`Restaurants`, `Business`), not part of what they say.
    prefixes = Counter(h[0].lower() for h in humps.values() if len(h) > 1)
    found: dict[tuple[tuple[str, ...], bool | None, bool], Field] = {}
    listed: dict[str, object] = {}
    hours = ""
    for path, value in leaves:
        if path[-1].lower() in DAYS:
            listed.setdefault(path[-1], value)
            hours = hours or (path[-2] if len(path) > 1 else path[-1])
        readable, truth = _truth(value)
        if not readable:
            continue
        parts = [h.lower() for h in humps[path[-1]]]
        if len(parts) > 1 and prefixes[parts[0]] > 1:
            parts = parts[1:]
        wanted = tuple(k for part in parts for k in keys(part))
        field = Field(".".join(path), wanted, keys("".join(parts))[0], truth, path[-1][:1].isupper())
        if wanted and len(found) < MAX_FIELDS:  # the same words and value under two paths are one field
            found.setdefault((wanted, truth, field.capitalised), field)
    with_hours = sum(any(path[-1].lower() in DAYS for path, _ in record) for record in each)
    return list(found.values()), listed if with_hours == 1 else {}, hours


def _mentions(stems: list[str | None], places: list[int], field: Field) -> Iterator[tuple[int, int]]:
    """(first, last) word indexes, from the `places` where one of the field's words stands, where the answer
    uses all of them, in any order, with at most one other word among them and no clause end; or the name's
    words written as one ("takeout")."""
    width = len(field.words) + 1
    for i in places:
        if stems[i] == field.whole:
            yield i, i
        elif stems[i] in field.words:
            window = stems[i:i + width]
            if None in window:
                window = window[:window.index(None)]
            if set(field.words) <= set(window):
                yield i, i + max(j for j, w in enumerate(window) if w in field.words)


def _negated(pieces: list[str], first: int, last: int) -> bool:
    """Whether a negation governs the mention: a few words before it in its clause ("does not offer outdoor
    seating"), also across the commas of a list ("not casual, trendy, or hipster"), or just after it
    ("outdoor seating is not available")."""
    words = 0
    since_comma = 0
    # An item of a list ends where the list goes on or stops: "not trendy, hipster, or loud;" but not
    # "does not offer WiFi, and valet parking is offered".
    item = last + 1 == len(pieces) or pieces[last + 1] in CLAUSE_ENDS | LIST_JOINS
    for i in range(first - 1, -1, -1):
        piece = pieces[i]
        if piece == ",":
            if since_comma > 1 or not item:  # a clause, not one item of a list
                break
            since_comma = 0
            continue
        if piece in CLAUSE_ENDS:
            break
        if piece in NEGATIVE or piece.endswith("n't"):
            return True
        if piece not in LIST_JOINS:
            words += 1
            since_comma += 1
        if words >= REACH_BACK:
            break
    # After it, a negated verb "to be" closes the list that the mention opens or belongs to: "valet and garage
    # parking options are not available". Any other verb, as in "has valet parking and does not offer WiFi",
    # starts a claim of its own.
    ahead = pieces[last + 1:last + 1 + REACH_AHEAD]
    for i, piece in enumerate(ahead):
        if piece in CLAUSE_ENDS - {","}:
            break
        if piece in UNAVAILABLE or piece in BE_NOT or piece in BE and ahead[i + 1:i + 2] in (["not"], ["never"]):
            return True
    return False


def read_records(passages: list[str]) -> Records:
    """The context's records: their yes/no fields and opening hours, and whether they are all it holds."""
    said = [p for p in passages if p and not p.isspace()]
    records = list(_records(said))
    known, listed, hours = _read(records)
    return Records(known, listed, hours, bool(said) and len(records) == len(said))


def misread(field: str) -> str:
    """A reviewer's reason for a claim that a record's field contradicts."""
    return f"states the record's field {field!r} otherwise than the record"


def _stated(answer: str, context: Context) -> Reading:
    """The records rule: the answer's statements against the records' yes/no fields, each pointed at as the claim
    that holds it (`claim_around`)."""
    records = context.shared(read_records)
    found = [Conflict(*claim_around(answer, start, end), start, name, evidence, misread(name))
             for start, end, name, evidence in misstated_fields(answer, context.passages, records.fields)]
    return Reading(found, len(records.fields) if records.only else 0)


def misstated_fields(answer: str, passages: list[str], known: list[Field]
               ) -> list[tuple[int, int, str, Evidence | None]]:
    """Where the answer states a field against the record (the words that mention it; the field, its place in the
    context): at most one per field and sentence."""
    if not known:  # a context of prose: nothing to read the answer against
        return []
    # A sentence looks only at the fields whose rarest word (or whole name) it uses.
    frequency = Counter(word for field in known for word in set(field.words))
    by_word: dict[str, list[Field]] = {}
    for field in known:
        for word in {min(field.words, key=frequency.__getitem__), field.whole}:
            by_word.setdefault(word, []).append(field)
    checks = 0
    cited: dict[str, Evidence | None] = {}  # each field's place in the context, looked up once

    def evidence(name: str) -> Evidence | None:
        if name not in cited:
            cited[name] = field_evidence(passages, name)
        return cited[name]

    found: list[tuple[int, int, str, Evidence | None]] = []
    for start, end in sentences(answer):
        turns = [start, *(m.end() for m in TURNS.finditer(answer, start, end)), end]
        unsaid = [(a, b) for a, b in zip(turns, turns[1:], strict=False) if UNSAID.search(answer, a, b)]
        matches = list(PIECE.finditer(answer, start, end))
        pieces = [m.group().lower().replace("’", "'") for m in matches]
        stems: list[str | None] = [None if p in CLAUSE_ENDS else keys(p)[-1] for p in pieces]
        # A capitalised word inside a sentence is a name ("State Street"), not the lower-case field `street`.
        named = [None if i and m.group()[:1].isupper() else stem
                 for i, (stem, m) in enumerate(zip(stems, matches, strict=True))]
        where: dict[str, list[int]] = {}
        for i, stem in enumerate(stems):
            if stem is not None:
                where.setdefault(stem, []).append(i)
        candidates = {id(f): f for stem in where for f in by_word.get(stem, ())}
        for field in candidates.values():
            places = sorted({i for word in {*field.words, field.whole} for i in where.get(word, ())})
            checks += len(places)
            if checks > MAX_CHECKS:
                return found
            for first, last in _mentions(stems if field.capitalised else named, places, field):
                if any(a <= matches[first].start() < b for a, b in unsaid):
                    continue
                stated = not _negated(pieces, first, last)
                if field.value is None or stated != field.value:
                    found.append((matches[first].start(), matches[last].end(), field.name, evidence(field.name)))
                    break
    return found


def claim_around(text: str, start: int, end: int, reach: int = 500) -> tuple[int, int]:
    """The claim of `text` that holds text[start:end]: its clause (from the punctuation before it to the punctuation
    after), cut where "and" or "with" joins another claim ("a casual ambiance with a trendy atmosphere"), looking at
    most `reach` characters each way. On the Data2txt fit half (n 192) the cut raised span F1 from 0.445 to 0.473."""
    floor, ceiling = max(0, start - reach), min(len(text), end + reach)
    before = max(max(text.rfind(mark, floor, start) for mark in CLAUSE_MARKS) + 1, floor)
    after = min((i for i in (text.find(mark, end, ceiling) for mark in CLAUSE_MARKS) if i >= 0), default=ceiling)
    before = max((m.end() for m in CLAIM_JOINS.finditer(text, before, start)), default=before)
    after = next((m.start() for m in CLAIM_JOINS.finditer(text, end, after)), after)
    while before < start and text[before].isspace():
        before += 1
    return before, after


def field_evidence(passages: list[str], name: str) -> Evidence | None:
    """Where the record gives the field's value (the first place its name appears as a key)."""
    key = name.rsplit(".", 1)[-1]
    pattern = re.compile(re.escape(f'"{key}"') + r"\s*:\s*(?:\{|[^,}\]]*)")
    for number, passage in enumerate(passages, 1):
        if (place := pattern.search(passage)) is not None:
            return Evidence(passage=number, start=place.start(), end=place.end(), text=place.group())
    return None


register(Rule(name="records", read=_stated, version=VERSION))
