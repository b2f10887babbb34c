"""The words a claim is made of, and how forgivingly two texts' words are matched.

Shared by the checks that compare an answer's words with the context's (`grounding`, `alignment`):
case is ignored, simple inflections are stripped (`trimesters` ≈ `trimester`, `advised` ≈ `advise`),
`1,000` = `1000`, number words equal their digits, and a hyphenated word matches part by part.
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


def content_keys(text: str) -> set[str]:
    """The keys of the words of `text` that can carry a claim."""
    return {k for w in words(text) if w not in IGNORED for k in keys(w)}
