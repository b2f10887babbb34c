"""Text as every detector reads it: its sentences and list items, its words, which of them carry a claim, and
how forgivingly two texts' words are matched. The one home of the tokeniser, the stop-word list, the sentence
splitter and the list-marker pattern; a detector that reads text imports them from here.

Matching (`keys`, `vocabulary`, `content_keys`): case is ignored, simple inflections are stripped (`trimesters` ≈
`trimester`, `advised` ≈ `advise`), `1,000` = `1000`, number words equal their digits, and a hyphenated word matches
part by part. (Folding look-alike letters for topic keywords, and model names, is `morphguard.folding`'s.)
"""

from __future__ import annotations

import re
from functools import lru_cache

TOKEN = re.compile(r"\d+(?:[.,]\d+)*|[^\W\d_]+(?:[-'’][^\W\d_]+)*", re.UNICODE)

# Function words, and the words answers use to talk about their sources ("according to the passage"):
# neither carries a claim that the context would have to contain.
IGNORED = frozenset("""
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

NUMBER_WORDS = {w: str(n) for n, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty".split())}
_SUFFIXES = ("ations", "ation", "ments", "ment", "ingly", "edly", "ings", "ing", "ies", "ied", "ers", "er",
             "est", "ely", "ly", "es", "ed", "s", "e")


def _stem(word: str) -> str:
    for suffix in _SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


def number(token: str) -> str:
    """`1,000` and `1000` alike; `3.50` and `3.5` alike; `09` and `9` alike (the `00` of `17:00`)."""
    plain = token.replace(",", "")
    if "." in plain:
        plain = plain.rstrip("0").rstrip(".")
    whole, dot, fraction = plain.partition(".")
    return (whole.lstrip("0") or "0") + dot + fraction


# Tokens longer than this are keyed but not cached: the cache outlives requests, and a client could otherwise
# fill its 65,536 places with megabyte-long "words".
CACHED_TOKEN_CHARS = 64


def keys(token: str) -> tuple[str, ...]:
    """What a token must find in the context: its number, or the stem of each part of a hyphenated word."""
    return _cached_keys(token) if len(token) <= CACHED_TOKEN_CHARS else _keys(token)


@lru_cache(maxsize=1 << 16)
def _cached_keys(token: str) -> tuple[str, ...]:
    return _keys(token)


def _keys(token: str) -> tuple[str, ...]:
    lowered = token.lower().replace("’", "'")
    if lowered[0].isdigit():
        return (number(lowered),)
    if lowered in NUMBER_WORDS:
        return (NUMBER_WORDS[lowered],)
    lowered = lowered.removesuffix("'s")
    return tuple(_stem(part) for part in re.split(r"[-']", lowered) if part)


# The humps of a camel-cased identifier: structured contexts name their fields `OutdoorSeating`, and an
# answer says "outdoor seating".
HUMP = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")


def vocabulary(passages: list[str]) -> set[str]:
    """Every key the context offers (see `keys`), and the words of its camel-cased identifiers."""
    found: set[str] = set()
    for passage in passages:
        for match in TOKEN.finditer(passage):
            token = match.group()
            offered = keys(token)
            found.update(offered)
            if len(offered) > 1:  # "third-trimester" also offers itself whole
                found.add("".join(offered))
            if token[0].isalpha() and not token.islower() and not token[1:].islower():
                found.update(k for hump in HUMP.findall(token) for k in keys(hump))
    return found


NEGATIONS = frozenset("not no never none nothing neither nor without cannot can't don't doesn't didn't isn't "
                      "aren't wasn't weren't won't wouldn't shouldn't couldn't hasn't haven't hadn't".split())
# Words that carry a negation in what they mean: a faithful copy may fold "not" into one of them ("so the birds do
# not become used to it" -> "to prevent the birds becoming used to it"; "it is unclear how" -> "he does not know how").
NEGATIVE_WORDS = frozenset("prevent prevents prevented preventing avoid avoids avoided avoiding unable unclear unknown "
                           "fail fails failed failing lack lacks lacked lacking refuse refuses refused refusing deny "
                           "denies denied denying stop stops stopped stopping absent".split())


def words(text: str) -> list[str]:
    """The tokens of `text`, lower-cased, curly apostrophes straightened."""
    return [m.group().lower().replace("’", "'") for m in TOKEN.finditer(text)]


# Relevance: which sentences of the context a statement is about (`focus`, `spans.evidence_for`), and which answer
# sentences state anything (`statements`). Coarser than matching: any run of letters, digits and underscores is a
# word ("3.5" is two), and only function words are left out, so a sentence that merely speaks of "the passage" still
# shares a word with one. Reading relevance with the matching tokeniser and `IGNORED` changed the context sent to
# the judge for 164 of 712 report-half answers and their evidence for 153, so the two stay apart.
RELEVANCE_WORD = re.compile(r"\w+(?:[-'’]\w+)*", re.UNICODE)
FUNCTION_WORDS = frozenset(
    "a an the and or of to in on at for by with from as is are was were be been being it its this that these those "
    "which who whom whose there their they them he she his her we our you your i me my not no do does did has have had "
    "can could will would should may might must also than then so if but".split()
)


def content_words(text: str) -> set[str]:
    """The words of `text` relevance is read on (`RELEVANCE_WORD`), lower-cased, function words left out."""
    return {w.lower() for w in RELEVANCE_WORD.findall(text) if w.lower() not in FUNCTION_WORDS}


def content_keys(text: str) -> set[str]:
    """The keys of the words of `text` that can carry a claim."""
    return {k for w in words(text) if w not in IGNORED for k in keys(w)}


# --- sentences and list items ---------------------------------------------------------------------------------------

# A list item's marker: "5." or "5)" (at most three digits, so a year is no marker) or a bullet.
MARKER = r"(?:\d{1,3}[.)]|[-*•])"
# The marker before an item's words, cut off before the item is read ("1.5 million" opens with no marker).
LIST_MARKER = re.compile(rf"\s*{MARKER}\s+")
# A sentence ends at . ! ? followed by white space (so "3.5" and "U.S.-based" stay whole) or at a line break; a list
# marker ("5." or "5)" opening a line) belongs to the item it numbers.
_SENTENCE_END = re.compile(r"[.!?]+[\"')\]]*(?=\s)|\n")
_MARKER_ALONE = re.compile(rf"\s*{MARKER}\s*")
_BULLET = re.compile(rf"^{LIST_MARKER.pattern}")


def sentence_ends(text: str, start: int = 0) -> list[int]:
    """Where each finished sentence of `text[start:]` ends (a sentence begins at `start`). An end needs the white
    space after it, so the ends found in a text are still its ends once more text is appended: a stream can be cut
    into sentences as it arrives."""
    ends = []
    for match in _SENTENCE_END.finditer(text, start):
        if not _MARKER_ALONE.fullmatch(text, start, match.end()):
            ends.append(match.end())
            start = match.end()
    return ends


def sentences(text: str) -> list[tuple[int, int]]:
    """(start, end) of each sentence of `text`, stripped of surrounding spaces."""
    bounds = [0, *sentence_ends(text)]
    cuts = list(zip(bounds, bounds[1:], strict=False))
    cuts.append((bounds[-1], len(text)))
    out = []
    for start, end in cuts:
        raw = text[start:end]
        start, end = start + len(raw) - len(raw.lstrip()), end - (len(raw) - len(raw.rstrip()))
        if end > start:
            out.append((start, end))
    return out


# A clause as `spans.locate` narrows a factoid's place to: up to . ! ? ; or a line break, wherever they stand. Finer
# than `sentences` (which keeps "3.5" whole and a list marker with its item); locating within `sentences` moved 387
# of 6,210 fuzzy-located factoids on RAGTruth, so the two stay apart.
CLAUSE = re.compile(r"[^.!?;\n]+[.!?;]*", re.UNICODE)
# Sentence and list-item breaks as an answer is read for its statements: . ! ? and a space before what opens a
# sentence (a capital, a digit, a quote, a bullet), and line breaks.
_BREAK = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[]?[A-Z0-9*•-])|\n+")
# Words that talk about the retrieval rather than the world: a sentence made only of them states no fact.
_META = frozenset(
    "based provided passage passages context information given question answer answers mentioned according "
    "summary overall therefore however confidently confident sure help hope following here below above".split()
)


def pieces(answer: str) -> list[str]:
    """The answer's sentences and list items, as written, without a list item's marker."""
    return [text for piece in _BREAK.split(answer) if (text := _BULLET.sub("", piece).strip())]


def statements(answer: str, limit: int = 16) -> list[str]:
    """The answer's sentences and list items that state something, in order, as written.

    Dropped: intros ending in a colon ("Based on the passages, the reasons are:") and sentences whose
    content words all talk about the passages or the answering itself.
    """
    out = [text for text in pieces(answer) if not text.endswith(":") and len(content_words(text) - _META) >= 2]
    return out[:limit]


def about_the_sources(text: str) -> bool:
    """Whether every content word of `text` talks about the passages or the answering ("Based on the passages:").
    A bare "No." has no content word, and so says something."""
    found = content_words(text)
    return bool(found) and found <= _META


# --- the calendar ---------------------------------------------------------------------------------------------------

DAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
          "november", "december")
