"""Grounding: which of the answer's content words the context never uses. No LLM call; milliseconds.

An answer made of the context's own words may still be wrong (a negation, a swapped entity), but a
number, a name or a content word that appears nowhere in the context is the commonest trace of invented
content. Per answer sentence this detector lists those words with their offsets; the answer's score
grows with how many there are, numbers and names weighing more. Its counts are also exposed as
`Detection.features`, for checks that combine it with a judge.

Matching is deliberately forgiving, so that rewording is not mistaken for invention: case is ignored,
simple inflections are stripped (`trimesters` ≈ `trimester`, `advised` ≈ `advise`), `1,000` = `1000`,
number words equal their digits, and a hyphenated word is grounded when each of its parts is.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass

from pydantic import Field

from morphguard.config import Section
from morphguard.detectors.registry import DetectorSpec, register
from morphguard.detectors.spans import sentences
from morphguard.models import Cost, Detection, DetectionStats, Factoid, RagInput

_TOKEN = re.compile(r"\d+(?:[.,]\d+)*|[^\W\d_]+(?:[-'’][^\W\d_]+)*", re.UNICODE)

# Function words, and the words answers use to talk about their sources ("according to the passage"):
# neither carries a claim that the context would have to contain.
_IGNORED = frozenset("""
a an the and or nor but so yet if then than as of to in on at for by with from into onto upon about above
below over under between among through during before after since until while within without against
toward towards via per across along around behind beyond near off out up down
is are was were be been being am do does did done doing has have had having can could will would shall
should may might must ought need needs
i me my mine we us our ours you your yours he him his she her hers it its they them their theirs one ones
this that these those there here who whom whose which what when where why how whether
not no yes all any both each either neither every few many more most much other others some such own same
very too also just only even still already again ever never always often sometimes usually
s t can't cannot don't doesn't didn't isn't aren't wasn't weren't won't wouldn't shouldn't couldn't
it's that's there's they're we're you're i'm let's
however therefore thus hence moreover furthermore additionally overall although though because whereas
etc e.g i.e eg ie
according based provided given mentioned stated states state says said say described describes
passage passages context text article document documents source sources information data summary
answer question note overview
""".split())

_NUMBER_WORDS = {w: str(n) for n, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty".split())}
_SUFFIXES = ("ations", "ation", "ments", "ment", "ingly", "edly", "ings", "ing", "ies", "ied", "ers", "er",
             "est", "ely", "ly", "es", "ed", "s", "e")


def _stem(word: str) -> str:
    for suffix in _SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


def _number(token: str) -> str:
    """`1,000` and `1000` alike; `3.50` and `3.5` alike."""
    plain = token.replace(",", "")
    if "." in plain:
        plain = plain.rstrip("0").rstrip(".")
    return plain


def _keys(token: str) -> list[str]:
    """What a token must find in the context: its number, or the stem of each part of a hyphenated word."""
    lowered = token.lower().replace("’", "'")
    if lowered[0].isdigit():
        return [_number(lowered)]
    if lowered in _NUMBER_WORDS:
        return [_NUMBER_WORDS[lowered]]
    lowered = lowered.removesuffix("'s")
    return [_stem(part) for part in re.split(r"[-']", lowered) if part]


def vocabulary(passages: list[str]) -> set[str]:
    """Every key the context offers (see `_keys`)."""
    found: set[str] = set()
    for passage in passages:
        for match in _TOKEN.finditer(passage):
            keys = _keys(match.group())
            found.update(keys)
            if len(keys) > 1:  # "third-trimester" also offers itself whole
                found.add("".join(keys))
    return found


@dataclass(frozen=True)
class Word:
    text: str
    start: int
    end: int
    kind: str  # number | name | word


@dataclass(frozen=True)
class SentenceReport:
    start: int
    end: int
    content: int  # content words in the sentence
    unsupported: list[Word]


def ungrounded(answer: str, passages: list[str]) -> list[SentenceReport]:
    """Per answer sentence: its content words, and those the context does not contain."""
    known = vocabulary(passages)
    reports = []
    for start, end in sentences(answer):
        content = 0
        missing: list[Word] = []
        seen: set[str] = set()
        for match in _TOKEN.finditer(answer, start, end):
            token = match.group()
            if token.lower().replace("’", "'") in _IGNORED or len(token) == 1 and not token.isdigit():
                continue
            content += 1
            keys = _keys(token)
            if all(k in known for k in keys) or "".join(keys) in known:
                continue
            if token.lower() in seen:
                continue
            seen.add(token.lower())
            first = match.start() == start
            kind = ("number" if token[0].isdigit() or token.lower() in _NUMBER_WORDS
                    else "name" if token[0].isupper() and not first else "word")
            missing.append(Word(token, match.start(), match.end(), kind))
        reports.append(SentenceReport(start, end, content, missing))
    return reports


_NEGATIONS = frozenset("not no never none nothing neither nor without cannot can't don't doesn't didn't isn't aren't "
                       "wasn't weren't won't wouldn't shouldn't couldn't hasn't haven't hadn't".split())
_HEDGES = frozenset("may might could some only usually often generally typically approximately nearly almost "
                    "sometimes mostly likely possibly partially occasionally rarely".split())


def _words(text: str) -> list[str]:
    return [m.group().lower().replace("’", "'") for m in _TOKEN.finditer(text)]


def _content_keys(text: str) -> set[str]:
    return {k for w in _words(text) if w not in _IGNORED for k in _keys(w)}


def _numbers(text: str) -> set[str]:
    return {_number(w) for w in _words(text) if w[0].isdigit()}


def _names(text: str) -> set[str]:
    """Capitalised words that do not open a sentence."""
    return {m.group() for m in _TOKEN.finditer(text) if m.group()[0].isupper() and m.start() > 0
            and not re.match(r"[.!?:;\n]\s*$", text[max(0, m.start() - 3):m.start()])}


def mismatches(answer: str, passages: list[str], min_overlap: float = 0.5) -> dict[str, float]:
    """Answer sentences that restate a context sentence (most of their content words are in it) but differ
    from it where a copied claim goes wrong: its polarity, a number, a hedge dropped. Their words are all
    in the context, so unsupported-word counts cannot see these; a count of each kind."""
    context = [(text, _content_keys(text)) for p in passages for text in (p[a:b] for a, b in sentences(p))]
    found = {"negation_mismatch": 0.0, "number_mismatch": 0.0, "name_mismatch": 0.0, "hedge_dropped": 0.0}
    for start, end in sentences(answer):
        sentence = answer[start:end]
        keys = _content_keys(sentence)
        if not keys or not context:
            continue
        text, shared = max(((t, len(keys & k)) for t, k in context), key=lambda pair: pair[1])
        if shared / len(keys) < min_overlap:
            continue
        words, source = set(_words(sentence)), set(_words(text))
        found["negation_mismatch"] += bool(words & _NEGATIONS) != bool(source & _NEGATIONS)
        numbers, offered = _numbers(sentence), _numbers(text)
        found["number_mismatch"] += bool(offered and numbers - offered)
        found["name_mismatch"] += bool(_names(sentence) - _names(text))
        found["hedge_dropped"] += bool((source & _HEDGES) - words)
    return found


class GroundingSettings(Section):
    """The `grounding` config section."""

    scale: float = Field(4.0, gt=0)  # score = 1 - exp(-weight / scale); weight = unsupported words, weighted
    number_weight: float = Field(2.0, ge=0)  # an unsupported number counts this many words
    name_weight: float = Field(1.5, ge=0)  # an unsupported name (capitalised, not sentence-initial)


class Grounding:
    name = "grounding"

    def __init__(self, settings: GroundingSettings, threshold: float = 0.5) -> None:
        self.settings = settings
        self.threshold = threshold

    def _weight(self, words: list[Word]) -> float:
        weights = {"number": self.settings.number_weight, "name": self.settings.name_weight, "word": 1.0}
        return sum(weights[w.kind] for w in words)

    def _score(self, weight: float) -> float:
        return 1.0 - math.exp(-weight / self.settings.scale)

    async def detect(self, rag: RagInput, answer: str) -> Detection:
        started = time.perf_counter()
        reports = ungrounded(answer, rag.passages)
        missing = [w for r in reports for w in r.unsupported]
        content = sum(r.content for r in reports)
        score = self._score(self._weight(missing))
        factoids = [Factoid(text=answer[r.start:r.end], start=r.start, end=r.end, label="unsupported",
                            score=self._score(self._weight(r.unsupported)))
                    for r in reports if r.unsupported]
        features = {
            "content_words": float(content),
            "unsupported": float(len(missing)),
            "unsupported_numbers": float(sum(w.kind == "number" for w in missing)),
            "unsupported_names": float(sum(w.kind == "name" for w in missing)),
            "unsupported_share": len(missing) / content if content else 0.0,
            "worst_sentence_share": max((len(r.unsupported) / r.content for r in reports if r.content), default=0.0),
            **mismatches(answer, rag.passages),
        }
        return Detection(
            detector=self.name, score=score, threshold=self.threshold, flagged=score >= self.threshold,
            factoids=factoids, features=features,
            cost=Cost.of({}, time.perf_counter() - started),
            stats=DetectionStats(factoids=len(factoids)),
            settings={"unsupported_words": [w.text for w in missing]},
        )


VERSION = 2  # of the word lists and matching rules above: a change makes earlier eval results stale

register(DetectorSpec(
    name="grounding", settings=GroundingSettings, models=lambda settings: [],
    fingerprint=lambda settings: {"options": settings.model_dump(), "version": VERSION},
    build=lambda settings, threshold, llm: Grounding(settings, threshold)))
