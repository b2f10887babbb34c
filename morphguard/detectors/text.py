"""Text as every detector reads it: its sentences and list items, its words, which of them carry a claim, and
how forgivingly two texts' words are matched. The one home of the tokeniser, the stop-word list, the sentence
splitter and the list-marker pattern; a detector that reads text imports them from here.

Matching (`keys`, `vocabulary`, `content_keys`): case is ignored, simple inflections are stripped (`trimesters` ≈
`trimester`, `advised` ≈ `advise`), `1,000` = `1000`, number words equal their digits, and a hyphenated word matches
part by part. (Folding look-alike letters for topic keywords, and model names, is `morphguard.folding`'s.)
"""

from __future__ import annotations

import re
import threading
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from functools import lru_cache
from typing import Generic, TypeVar

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
T = TypeVar("T")


def sentence_ends(text: str, start: int = 0) -> list[int]:
    """Where each finished sentence of `text[start:]` ends (a sentence begins at `start`). An end needs the white
    space after it, so the ends found in a text are still its ends once more text is appended: a stream can be cut
    into sentences as it arrives (`GrowingText`), and a text read again once it has grown split only from its last
    finished sentence (`GrowingSentences`)."""
    ends = []
    for match in _SENTENCE_END.finditer(text, start):
        if not _MARKER_ALONE.fullmatch(text, start, match.end()):
            ends.append(match.end())
            start = match.end()
    return ends


def sentences(text: str, start: int = 0) -> list[tuple[int, int]]:
    """(start, end) of each sentence of `text[start:]` (a sentence begins at `start`), stripped of surrounding
    spaces."""
    return _stripped(text, [start, *sentence_ends(text, start)])


def _stripped(text: str, bounds: list[int]) -> list[tuple[int, int]]:
    """The sentences between `bounds` (and from the last to the end of `text`), stripped, the empty left out."""
    cuts = [*zip(bounds, bounds[1:], strict=False), (bounds[-1], len(text))]
    return [at for start, end in cuts if (at := _strip(text, start, end)) is not None]


def _strip(text: str, start: int, end: int) -> tuple[int, int] | None:
    """`text[start:end]` without the spaces around it, as offsets into `text` (None: nothing is left)."""
    raw = text[start:end]
    start, end = start + len(raw) - len(raw.lstrip()), end - (len(raw) - len(raw.rstrip()))
    return (start, end) if end > start else None


# What a sentence end can begin with before the white space after it: . ! ? and the closing marks after them.
_END_MARKS = ".!?\"')]"


class GrowingText:
    """A text that grows at its end, part by part (a streamed answer): the ends of its sentences found as the parts
    arrive, each part read once with at most two characters before it (what of the marks it ends with a sentence end
    can begin with) and the sentence still open when a mark may end it; the parts joined only when the whole is read.
    `ends` is always `sentence_ends` of the text so far."""

    def __init__(self) -> None:
        self.ends: list[int] = []
        self._parts: list[str] = []
        self._at: list[int] = []  # where each part begins
        self._length = 0
        self._joined = ""  # the parts joined, as far as the last reading of the whole
        self._open: list[str] = []  # the text after the last end, in parts
        self._marks = ""  # the marks the text ends with, as a sentence end can begin with them: "", "." or ".)"

    def __len__(self) -> int:
        return self._length

    def __str__(self) -> str:
        if len(self._joined) < self._length:
            at = bisect_left(self._at, len(self._joined))  # the first part not joined
            self._joined += "".join(self._parts[at:])
        return self._joined

    def add(self, part: str) -> list[int]:
        """Append `part`; the ends of the sentences it finishes."""
        if not part:
            return []
        window = self._marks + part
        offset = self._length - len(self._marks)  # where the window begins in the text
        self._parts.append(part)
        self._at.append(self._length)
        self._length += len(part)
        self._open.append(part)
        found: list[int] = []
        start = base = self.ends[-1] if self.ends else 0
        opened: str | None = None  # the open sentence (the text from `base` on), once a mark may end it
        for match in _SENTENCE_END.finditer(window):
            end = offset + match.end()
            if opened is None:
                opened = "".join(self._open)
            if not _MARKER_ALONE.fullmatch(opened, start - base, end - base):
                found.append(end)
                start = end
        if opened is not None:
            self._open = [opened[start - base:]]
        self.ends += found
        trailing = part[len(part.rstrip(_END_MARKS)):]
        run = self._marks + trailing if len(trailing) == len(part) else trailing
        last = max(run.rfind(mark) for mark in ".!?") if run else -1
        self._marks = "" if last < 0 else "." if last == len(run) - 1 else ".)"
        return found

    def spaces_to(self, at: int) -> int:
        """Where the white space that begins at `at` ends (`at` itself where none does)."""
        k = bisect_right(self._at, at) - 1
        while 0 <= k < len(self._parts):
            rest = self._parts[k][at - self._at[k]:]
            at += len(rest) - len(rest.lstrip())
            if rest.strip():
                break
            k += 1
        return at


class GrowingSentences(Generic[T]):
    """The sentences of a text read again each time it has grown at its end (the checks of one streamed answer),
    with what `each` reads of each of them: a reading splits the text only from its last finished sentence and reads
    only the sentences not finished before, the finished ones kept with what was read of them. A text that does not
    extend the longest one read (the same answer cut shorter, or another one) reuses what the two share. The checks
    of one answer may read it at once, from several threads."""

    def __init__(self) -> None:
        self._text = ""  # the longest text read
        self._ends: list[int] = []  # its sentence ends
        self._read: list[tuple[tuple[int, int], T] | None] = []  # per end, the sentence before it (None: empty)
        self._open: tuple[tuple[int, int], str, T] | None = None  # the last sentence read unfinished, its text
        self._lock = threading.Lock()

    def read(self, text: str, each: Callable[[int, int], T]) -> list[tuple[tuple[int, int], T]]:
        """Each sentence of `text`, (start, end) as `sentences` gives it, with `each(start, end)` of it."""
        with self._lock:
            if text.startswith(self._text):
                kept = len(self._ends)
            elif self._text.startswith(text):  # the same text cut shorter: its ends before the cut
                kept = bisect_left(self._ends, len(text))
            else:  # an end of the other text is one of this text where the two agree as far as the space after it
                kept = bisect_left(self._ends, _shared(text, self._text))
            ends, read = self._ends[:kept], self._read[:kept]
            last = ends[-1] if ends else 0
            more = sentence_ends(text, last)
            for start, end in zip([last, *more], more, strict=False):
                ends.append(end)
                at = _strip(text, start, end)
                read.append(None if at is None else (at, self._each(text, at, each)))
            out = [entry for entry in read if entry is not None]
            for at in _stripped(text, [ends[-1] if ends else 0]):  # the sentence still open, if any
                out.append((at, self._each(text, at, each)))
                self._open = at, text[at[0]:at[1]], out[-1][1]
            if len(text) >= len(self._text):
                self._text, self._ends, self._read = text, ends, read
            return out

    def _each(self, text: str, at: tuple[int, int], each: Callable[[int, int], T]) -> T:
        """`each` of one sentence; the sentence read last while it was open is not read again once finished."""
        if self._open is not None and self._open[0] == at and self._open[1] == text[at[0]:at[1]]:
            return self._open[2]
        return each(*at)


def _shared(a: str, b: str) -> int:
    """How many characters `a` and `b` open with alike."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


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
    return _pieces(_BREAK.split(answer))


def _pieces(parts: list[str]) -> list[str]:
    return [text for piece in parts if (text := _BULLET.sub("", piece).strip())]


_NOT_SPACE = re.compile(r"\S")


def settled_pieces(answer: str, at: int = 0) -> tuple[list[str], int]:
    """The `pieces` of `answer` from `at` (0, or where this said the settled ones of a shorter `answer` end) that no
    text appended to it can change, and where they end (`pieces` of the rest, from there, are the others). A break is
    settled once the answer holds the two characters after the white space it stands in: what follows a break decides
    it ("A. (B" breaks, "A. (b" does not)."""
    parts, start = [], at
    for match in _BREAK.finditer(answer, at):
        after = _NOT_SPACE.search(answer, match.end())
        if after is None or after.start() + 1 >= len(answer):
            break
        parts.append(answer[start:match.start()])
        start = match.end()
    return _pieces(parts), start


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
