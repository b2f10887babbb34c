"""Alignment: answer sentences that copy a context sentence but change it where a copy goes wrong.

A negated claim, a number or a name taken from elsewhere in the same context, a dropped qualifier: every
word of such a sentence is in the context, so counting unsupported words cannot see it. Here each answer
sentence is aligned with the context sentence it shares most content with, rare words weighing more
(inverse sentence frequency within the context). Where the answer sentence copies that sentence closely,
the differences that change a claim are reported, each with the strength of the copy: the weighted share
of the answer sentence's content found in the context sentence. A loose paraphrase, whose differences
are mostly rewording, yields nothing. No LLM call.
"""

from __future__ import annotations

import copy
import itertools
import math
import re
import threading
from collections import Counter
from collections.abc import Container
from dataclasses import dataclass
from difflib import SequenceMatcher
from functools import cached_property

from morphguard.detectors.text import (
    DAYS,
    IGNORED,
    LIST_MARKER,
    MONTHS,
    NEGATIONS,
    NEGATIVE_WORDS,
    TOKEN,
    GrowingSentences,
    about_the_sources,
    content_keys,
    keys,
    number,
    pieces,
    sentences,
    settled_pieces,
    words,
)
from morphguard.errors import CheckTooLargeError
from morphguard.models import Evidence

KINDS = ("negation", "number", "name", "qualifier")
VERSION = 6  # of the alignment and comparison rules below: a change makes earlier eval results stale

# Words and phrases that narrow a claim; a copy that drops one states more than its source does. "About" and "around"
# narrow only a number ("about 15 minutes", not "asked about it"), and "may" before a number is the month.
_QUALIFIER = re.compile(
    r"\b(?:only|usually|often|generally|typically|approximately|nearly|almost|sometimes|mostly|likely|possibly|"
    r"partially|occasionally|rarely|some|may(?!\s\d)|might|(?:about|around)(?=\s\d)|roughly|up to|at least|at most|"
    r"more than|over(?=\s\d)|less than|under(?=\s\d)|fewer than|in some|in most|in rare)\b", re.I)
# A bullet or "5." before an answer sentence is cut off before it is aligned (text.LIST_MARKER). `_ITEM_NUMBER`'s wider
# shapes only keep a number from being compared: cutting "1 Spray" could change which context sentence it copies.
# The number of a list item, which states nothing: "1. Season", "2  Season", "3-Place", "1 Spray", "1To construct"
# (a capital follows it; "40 patients were seen" opens with a claim).
_ITEM_NUMBER = re.compile(r"[\s*•-]*\d{1,3}(?:[.)]\s|\s{2,}|\s?[-–]?\s?(?=[A-Z]))")
_SENTENCE_END = ".!?:;\n"
# How far after a negation or a qualifier the word it bears on may stand: "not a provider", "some of his skills".
_REACH = 4
_BREAK = re.compile(r"[,;:.!?()]")
# The longest sentence, in words, that is compared whole. The diff's cost grows with the cube of the length on
# repetitive text ("only only only ..." against "usually only usually only ..."; 4,000 words took ten minutes), and an
# answer can echo whatever a hostile context holds. A longer copy or source (a scraped list that never ends a
# sentence, or an answer padded to slip past the comparison) is compared in pieces of at most `PIECE` words, each
# against the stretch of the source around its rarest shared word (`_compare`): every diff stays small, and the work
# grows with the length, not with its cube.
DIFF_LIMIT = 250
PIECE = 60
_STARTS = 8  # where the rarest word stands more often than this, only its first places are tried
# The most context sentences one check compares answer sentences with (`Context.copied`). Prose reads a few per answer
# sentence, its rarest words leading to the copy; text made of a few common words can make every answer sentence
# read every context sentence, the square of the length. Past this (about a second of CPU) the check is refused
# (CheckTooLargeError, saying where the answer's sentences compared within it end), never cut short: a comparison that
# stopped part-way would pass what it did not read.
MAX_COMPARED = 250_000
# A name is swapped where one edit replaces at most this many words on either side ("Bell" -> "Jacque Wilson"). A longer
# stretch replaced is mostly rewording that joins a fact about someone the context names elsewhere ("charged a
# Philadelphia woman" -> "charged Keonna Thomas, a Philadelphia woman"), so there a name counts only where the context
# never uses it ("based at McClellan ... California" -> "located in Illinois"). On the fit halves this took RAGTruth
# Summary's faithful answers with a changed name from 50 of 159 to 12 (its hallucinated ones from 12 of 54 to 2);
# HaluEval's hallucinated answers with one went from 58 of 209 to 43, its faithful ones stayed at none.
_SWAP = 3
# A day or month dropped from a copy is a copy of less, even where a name takes its place ("charged a woman on
# Thursday" -> "charged a woman, Keonna Thomas,"); a day put for another day still counts.
_CALENDAR = frozenset(DAYS + MONTHS)
# A sentence that names the passages denies things of them ("Passage 3 mentions the call, but it does not say who may
# join"), not of the world: compared with a context sentence it shares words with, its "not" would read as a negated
# copy. (On the RAGTruth QA fit half, 4 of the 6 faithful answers with a negated copy had only such.) Its numbers and
# names are still compared: "Preheat the oven to 175 degrees (Passage 2)" states a fact.
_SPEAKS_OF_SOURCES = re.compile(r"\bpassages?\b", re.I)
# Words after which a number points into the sources ("Passage 3", "step 5") rather than stating a fact.
_POINTERS = frozenset("passage passages step steps source sources document documents paragraph section".split())


@dataclass(frozen=True)
class Conflict:
    kind: str  # one of KINDS
    start: int  # the answer sentence
    end: int
    strength: float  # how closely the answer sentence copies the context sentence, in (0, 1]
    evidence: Evidence  # that context sentence


@dataclass(frozen=True)
class _Words:
    """A sentence as the diff sees it: every word lower-cased, which of them are names, and their stems."""

    tokens: tuple[str, ...]
    names: frozenset[int]  # positions in `tokens` of capitalised words that do not open the sentence
    # positions of numbers taken to state nothing: a list item's own number (`_ITEM_NUMBER`) and one that points
    # into the sources ("(Passage 2)")
    markers: frozenset[int]
    stems: frozenset[str]  # the keys of every word (words.keys), to ask whether a word is kept in other form
    breaks: frozenset[int]  # positions of words that punctuation parts from the word before ("if it does not, it")

    @classmethod
    def of(cls, text: str) -> _Words:
        found = list(TOKEN.finditer(text))
        names = frozenset(i for i, m in enumerate(found)
                          if m.group()[0].isupper() and i > 0 and not _opens(text, m.start()))
        tokens = tuple(words(text))
        item = bool(_ITEM_NUMBER.match(text))
        markers = frozenset(i for i, t in enumerate(tokens)
                            if t[0].isdigit() and (item if i == 0 else tokens[i - 1] in _POINTERS))
        breaks = frozenset(i for i in range(1, len(found)) if _BREAK.search(text, found[i - 1].end(), found[i].start()))
        return cls(tokens, names, markers, frozenset(k for t in tokens for k in keys(t)), breaks)

    @cached_property
    def short_names(self) -> frozenset[str]:
        """What the sentence's names are shortened to: the initials of each run of names ("united states" -> "us",
        "centers for disease control" -> "cdc", "u s" -> "us"). Read only of a source whose name a copy replaces."""
        return _shortened(self.tokens, self.names)

    def bears_on(self, at: int) -> tuple[str, ...]:
        """The keys of the word that the negation or qualifier ending before `at` bears on: the first word within
        `_REACH` that carries a claim (none: the sentence ends first, "they are not.")."""
        for i in range(at, min(at + _REACH, len(self.tokens))):
            if i in self.breaks:
                break
            if self.tokens[i] not in IGNORED and self.tokens[i] not in NEGATIONS:
                return keys(self.tokens[i])
        return ()

    def negates(self) -> set[str]:
        """The keys of every word the sentence negates."""
        return {k for i, t in enumerate(self.tokens) if t in NEGATIONS for k in self.bears_on(i + 1)}

    def qualifiers(self) -> dict[str, list[tuple[str, ...]]]:
        """Each qualifier the sentence holds, with what each of its occurrences bears on."""
        text = " ".join(self.tokens)
        found: dict[str, list[tuple[str, ...]]] = {}
        after, counted = 1, 0  # the words up to the match's end, counted once along the sentence
        for match in _QUALIFIER.finditer(text):
            after += text.count(" ", counted, match.end())
            counted = match.end()
            # "in some ovens" and "on some ovens" hold the same qualifier
            found.setdefault(match.group().removeprefix("in "), []).append(self.bears_on(after))
        return found


def _shortened(tokens: tuple[str, ...], names: frozenset[int]) -> frozenset[str]:
    """The initials of each run of two to `_SHORTENED` names in `tokens` (`_Words.short_names`: a run may hold the
    small words of a name, "of", "for", "and", "the", which give no initial), and single letters run together."""
    runs: list[list[str]] = []
    current: list[str] = []
    for i, token in enumerate(tokens):
        if i in names:
            current.append(token)
        elif not (current and token in _NAME_JOINERS):
            if current:
                runs.append(current)
            current = []
    runs.append(current)
    letters = re.findall(r"\b(?:[a-z] )+[a-z]\b", " ".join(tokens))  # "U.S.", whose "S" follows a full stop
    return frozenset(["".join(t[0] for t in run[a:b]) for run in runs for a in range(len(run))
                      for b in range(a + 2, min(a + _SHORTENED, len(run)) + 1)]
                     + [spelt.replace(" ", "") for spelt in letters])


_NAME_JOINERS = frozenset(("of", "for", "and", "the", "&"))
_SHORTENED = 6  # the longest name shortened to its initials (which keeps the forms of a long run of names few)


def _opens(text: str, at: int) -> bool:
    """Whether the word at `at` opens a sentence: only white space stands between it and the text's start or the end
    of a sentence. (Looking back over the white space alone keeps reading a long text's names linear.)"""
    while at > 0 and text[at - 1].isspace() and text[at - 1] != "\n":
        at -= 1
    return at == 0 or text[at - 1] in _SENTENCE_END


class _Source:
    """A context sentence as the comparison reads it, built once per check however many answer runs copy it. Where
    each word stands is read only for a sentence too long to compare whole (`_stretch`)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.words = _Words.of(text)

    @cached_property
    def spans(self) -> list[tuple[int, int]]:
        """Where each word stands in `text`."""
        return [m.span() for m in TOKEN.finditer(self.text)]

    @cached_property
    def places(self) -> dict[str, list[int]]:
        """Each word's positions in `words.tokens`."""
        places: dict[str, list[int]] = {}
        for i, token in enumerate(self.words.tokens):
            places.setdefault(token, []).append(i)
        return places


def _differences(source: _Words, claim: _Words, negated: frozenset[str], known: Container[str]) -> set[str]:
    """The kinds of change that the edits turning `source` into `claim` make, word by word. A negation counts where
    one edit adds or drops it, but only about a word the copy shares: a negation dropped with the clause it stood in
    ("could not be further from home", left out of a copy of the sentence's first half) is a copy of less, not a
    change, and one added to a word that the source does not hold but another context sentence negates (`negated`:
    "was not restrained", joined to a copy of another sentence) is the context's own. Nor does one that a word meaning
    it takes the place of ("do not become used to" -> "prevent becoming used to": `NEGATIVE_WORDS`).
    A qualifier counts where the copy holds it fewer times than its source, about a word it keeps, so a hedge moved
    within the sentence ("until it flakes, about 15 minutes") is no change. A name or a number counts where one edit
    replaces it: a name that the source holds in no form ("Shapiro's" is Shapiro, "US" the United States), put in by a
    short edit or one the context never uses (`_SWAP`, `known`: the context's words), a number that the copy does not
    hold elsewhere ("by a vote of 7-0" moved to the end is no change). Numbers that state nothing
    (`_Words.markers`) are not compared, and a number dropped in one place with another put in elsewhere is no
    replacement: that is how a copy renumbers a list and cites its sources. (A replacement the diff splits into a
    deletion and an insertion, "1/2" for "2/2", is missed.)"""
    kinds = set()
    held = {number(t) for j, t in enumerate(claim.tokens) if t[0].isdigit() and j not in claim.markers}
    folded = _negative(claim) - _negative(source)  # > 0: the copy holds more words that mean a negation
    matcher = SequenceMatcher(None, source.tokens, claim.tokens, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        old, new = source.tokens[i1:i2], claim.tokens[j1:j2]
        dropped_negation = [source.bears_on(i + 1) for i in range(i1, i2) if source.tokens[i] in NEGATIONS]
        added_negation = [claim.bears_on(j + 1) for j in range(j1, j2) if claim.tokens[j] in NEGATIONS]
        if dropped_negation and not added_negation:
            if folded <= 0 and any(not word or claim.stems.intersection(word) for word in dropped_negation):
                kinds.add("negation")
        elif added_negation and not dropped_negation:
            if folded >= 0 and any(not word or source.stems.intersection(word) or not negated.intersection(word)
                                   for word in added_negation):
                kinds.add("negation")
        if tag == "replace":
            dropped = {number(t) for i, t in enumerate(old, i1) if t[0].isdigit() and i not in source.markers} - held
            added = {number(t) for j, t in enumerate(new, j1) if t[0].isdigit() and j not in claim.markers}
            if dropped and added - dropped:
                kinds.add("number")
        # a name only where one edit replaces it: answers often join facts about other people
        old_names = {source.tokens[i] for i in range(i1, i2) if i in source.names}
        new_names = {claim.tokens[j] for j in range(j1, j2) if j in claim.names}
        if old_names and not (old_names <= _CALENDAR and not new_names & _CALENDAR):
            held_names = source.stems | source.short_names
            put = [keys(name) for name in new_names - old_names if not held_names.issuperset(keys(name))]
            swapped = max(i2 - i1, j2 - j1) <= _SWAP
            if put and (swapped or any(k not in known for name in put for k in name)):
                kinds.add("name")
    kept = claim.qualifiers()
    hedged = {k for bearing in kept.values() for word in bearing for k in word}  # "about 45" for "up to 45" hedges
    for qualifier, bearing in source.qualifiers().items():
        if len(kept.get(qualifier, ())) < len(bearing) and any(
                not word or claim.stems.intersection(word) and not hedged.intersection(word) for word in bearing):
            kinds.add("qualifier")
    return kinds


def _negative(sentence: _Words) -> int:
    """How many of the sentence's words carry a negation in their meaning (`NEGATIVE_WORDS`, "non-...")."""
    return sum(t in NEGATIVE_WORDS or t.startswith("non-") for t in sentence.tokens)


def _negated(texts: list[str]) -> frozenset[str]:
    """The keys of every word that a context sentence negates."""
    return frozenset(k for text in texts for k in _Words.of(text).negates())


class Context:
    """The context's distinct sentences, indexed to find the one an answer sentence copies most of: built once per
    context, however many answer sentences `conflicts` aligns with it."""

    def __init__(self, passages: list[str]) -> None:
        where: dict[str, Evidence] = {}  # each distinct context sentence, where it first stands
        repeats: Counter[str] = Counter()  # and how often it stands there: rarity counts every occurrence
        for n, passage in enumerate(passages, 1):
            for a, b in sentences(passage):
                where.setdefault(passage[a:b], Evidence(passage=n, start=a, end=b, text=passage[a:b]))
                repeats[passage[a:b]] += 1
        self.compared = 0  # context sentences read for answer sentences so far (`MAX_COMPARED`)
        self.texts = list(where)
        self.evidence = list(where.values())
        self.held = [frozenset(content_keys(text)) for text in self.texts]
        self.sentences = sum(repeats.values())
        self.frequency: Counter[str] = Counter()
        self.holding: dict[str, list[int]] = {}
        for i, (text, held) in enumerate(zip(self.texts, self.held, strict=True)):
            for k in held:
                self.frequency[k] += repeats[text]
                self.holding.setdefault(k, []).append(i)
        # read only for an answer that copies a sentence, and then once: shared with every `fresh` copy
        self._sources: dict[int, _Source] = {}
        self._negated: list[frozenset[str]] = []

    def fresh(self, compared: int = 0) -> Context:
        """This context with `compared` comparisons counted (none: a check's first): the index is shared, the count
        (`MAX_COMPARED`) is a check's own (the checks of one growing answer read one index)."""
        counted = copy.copy(self)
        counted.compared = compared
        return counted

    def source(self, i: int) -> _Source:
        """The `i`-th context sentence as the comparison reads it."""
        return self._sources.get(i) or self._sources.setdefault(i, _Source(self.texts[i]))

    def negated(self) -> frozenset[str]:
        """The keys of every word that a context sentence negates."""
        if not self._negated:
            self._negated.append(_negated(self.texts))
        return self._negated[0]

    def copied(self, text: str) -> tuple[int, float] | None:
        """The context sentence `text` copies most of (its index), and the weighted share of `text`'s content it
        holds; None where they share no content word. On a tie, the first such sentence.

        The candidates are read rarest word first, and reading stops once the words left could not add up to the
        best share found: a sentence holding none of the words read so far holds at most those left, so none can
        beat (or tie, being later) the best. A copy is found among the few sentences holding its rarest words, and
        an answer sentence is not compared with every context sentence that shares a common word with it."""
        claim = frozenset(content_keys(text))
        known = [k for k in claim if k in self.frequency]
        if not known:
            return None
        weight = {k: math.log(1 + self.sentences / self.frequency[k]) if k in self.frequency
                  else math.log(1 + self.sentences) for k in claim}
        total = math.fsum(weight.values())  # fsum: exact, so no run's set order changes a tie or the cut
        rarest_first = sorted(known, key=lambda k: (-weight[k], k))
        # what a sentence holding only the words from the j-th on can share at most: their sum, rounded up by far more
        # than a float sum of at most a few hundred terms can be off (a bound too high only reads on)
        left = list(itertools.accumulate(weight[k] for k in reversed(rarest_first)))[::-1]
        left = [(1 + 1e-9) * bound / total for bound in left]
        best: tuple[float, int] | None = None  # (share, -index)
        seen: set[int] = set()
        for j, key in enumerate(rarest_first):
            if best is not None and left[j] < best[0]:
                break
            self.compared += len(self.holding[key])
            if self.compared > MAX_COMPARED:
                raise CheckTooLargeError(f"aligning the answer with its context takes more than {MAX_COMPARED} "
                                         "comparisons of sentences")
            for i in self.holding[key]:
                if i in seen:
                    continue
                seen.add(i)
                share = (math.fsum(weight[k] for k in claim & self.held[i]) / total, -i)
                if best is None or share > best:
                    best = share
        assert best is not None
        return -best[1], best[0]


def conflicts(answer: str, passages: list[str], min_copy: float = 0.4,
              context: Context | None = None) -> list[Conflict]:
    """Every change of the kinds in `KINDS` between an answer sentence and the context sentence it copies
    (at least `min_copy` of its weighted content). `context`: these passages' `Context`, built already."""
    context = Context(passages) if context is None else context.fresh()
    if not any(context.held):
        return []
    return [c for start, end in sentences(answer) for c in sentence_conflicts(answer, start, end, context, min_copy)]


def sentence_conflicts(answer: str, start: int, end: int, context: Context, min_copy: float = 0.4) -> list[Conflict]:
    """`conflicts` of the answer sentence `answer[start:end]`, read alone; the comparisons it makes are added to
    `context.compared`, and past `MAX_COMPARED` it raises `CheckTooLargeError` (`read`: `start`)."""
    marker = LIST_MARKER.match(answer, start, end)  # "5." numbers a list item; it states nothing
    sentence = answer[marker.end() if marker else start:end]
    # what the sentence denies of the passages ("it does not say who may join") is no negated copy
    kinds_read = set(KINDS) - ({"negation"} if _SPEAKS_OF_SOURCES.search(sentence) else set())
    # A sentence too long to compare whole may join many context sentences: each run of it is aligned on its own.
    parts = ([sentence] if len(TOKEN.findall(sentence)) <= DIFF_LIMIT
             else [sentence[a:b] for a, b in _runs(sentence)])
    changed: dict[str, tuple[float, int]] = {}  # per kind, the closest copy that changes it
    for text in parts:
        try:
            match = context.copied(text)
        except CheckTooLargeError as exc:  # the sentences before this one were compared within the bound
            raise CheckTooLargeError(str(exc), read=start) from None
        if match is None or match[1] < min_copy:
            continue
        best, copy = match
        for kind in _compare(context.source(best), text, context.negated(), context.frequency) & kinds_read:
            if kind not in changed or copy > changed[kind][0]:
                changed[kind] = (copy, best)
    return [Conflict(kind, start, end, changed[kind][0], context.evidence[changed[kind][1]])
            for kind in KINDS if kind in changed]


def _compare(source: _Source, copied_text: str, negated: frozenset[str], known: Container[str]) -> set[str]:
    """The kinds of change between a context sentence and an answer sentence (or a run of one) that copies it
    (`_differences`), in runs against stretches of the source where either is longer than `DIFF_LIMIT` words."""
    copied = _Words.of(copied_text)
    if max(len(source.words.tokens), len(copied.tokens)) <= DIFF_LIMIT:
        return _differences(source.words, copied, negated, known)
    kinds: set[str] = set()
    for a, b in _runs(copied_text):
        run = _Words.of(copied_text[a:b])
        stretch = _stretch(run, source)
        if stretch is not None:
            lo, hi = stretch
            kinds |= _differences(_Words.of(source.text[source.spans[lo][0]:source.spans[hi - 1][1]]), run, negated,
                                  known)
    return kinds


def _runs(text: str) -> list[tuple[int, int]]:
    """`text` cut into runs of at most `PIECE` words, at punctuation once a run holds half of that (start, end)."""
    found = list(TOKEN.finditer(text))
    cuts, first = [], 0
    for i in range(1, len(found)):
        if i - first >= PIECE or i - first >= PIECE // 2 and _BREAK.search(text, found[i - 1].end(), found[i].start()):
            cuts.append((found[first].start(), found[i - 1].end()))
            first = i
    return cuts + [(found[first].start(), found[-1].end())] if found else cuts


def _stretch(piece: _Words, source: _Source) -> tuple[int, int] | None:
    """The words of `source` (start, end) that `piece` copies, if it shares any: a window twice the piece's length
    around a place of its rarest shared word (the one holding most of its words), narrowed to run from its first word
    the piece copies to its last, with as many words either side as the piece holds beyond its own copied run (so
    that a word the piece replaces at its edge is still compared, while the sentence around the copy is not)."""
    places, tokens = source.places, source.words.tokens
    shared = [(len(places[t]), j) for j, t in enumerate(piece.tokens) if t in places]
    if not shared:
        return None
    _, j = min(shared)
    wanted, width = set(piece.tokens), 2 * len(piece.tokens)
    windows = []
    for place in places[piece.tokens[j]][:_STARTS]:
        lo = max(0, min(place - j - len(piece.tokens) // 2, len(tokens) - width))
        windows.append((sum(t in wanted for t in tokens[lo:lo + width]), -lo, lo))
    _, _, lo = max(windows)
    window = tokens[lo:lo + width]
    blocks = [m for m in SequenceMatcher(None, window, piece.tokens, autojunk=False).get_matching_blocks() if m.size]
    if not blocks:
        return None
    first, last = blocks[0], blocks[-1]
    start = max(0, first.a - first.b)
    end = min(len(window), last.a + last.size + len(piece.tokens) - last.b - last.size)
    return lo + start, lo + end


def quotable(passages: list[str]) -> set[str]:
    """The context's sentences as quotes are compared (`quotes_context`)."""
    return {_as_quoted(passage[a:b]) for passage in passages for a, b in sentences(passage)}


def quotes_context(answer: str, passages: list[str], context: set[str] | None = None) -> bool:
    """Whether every sentence of the answer is a whole sentence of the context as written (case, spacing,
    punctuation and a list item's marker aside), or only talks about the sources ("Based on the passages:"). Such an
    answer claims only what its context claims, whatever the question: a fragment ("Steven Spielberg") is no quote,
    since whether it answers rightly depends on the question, and neither is a verdict set before a quote ("Yes.",
    "It is safe.", a claim that ends in a colon), which the check would otherwise never ask a judge about.
    `context`: `quotable(passages)`, read already."""
    any_quote, all_claimed = _quoted(pieces(answer), quotable(passages) if context is None else context)
    return any_quote and all_claimed


def _quoted(texts: list[str], context: set[str], found: tuple[bool, bool] = (False, True)) -> tuple[bool, bool]:
    """Whether any of `texts` quotes `context`, and whether each quotes it or talks about the sources (`found`: that
    of the pieces before them)."""
    any_quote, all_claimed = found
    for text in texts:
        is_quote = _as_quoted(text) in context
        any_quote = any_quote or is_quote
        all_claimed = all_claimed and (is_quote or about_the_sources(text))
    return any_quote, all_claimed


class Quoting:
    """`quotes_context` of the checks of one growing answer: the pieces no appended text can change
    (`settled_pieces`) are read once, and each check reads only those after them. An answer that does not extend the
    last one read is read whole (and kept, unless it is shorter)."""

    def __init__(self, context: set[str]) -> None:
        self.context = context  # `quotable(passages)`
        self._lock = threading.Lock()
        self._answer = ""  # the answer read last
        self._settled = 0  # where its settled pieces end
        self._found = (False, True)  # of those pieces: whether any is a quote, whether each is one or about the sources

    def quotes(self, answer: str) -> bool:
        with self._lock:
            if answer.startswith(self._answer):
                at, found = self._settled, self._found
            else:
                at, found = 0, (False, True)
            settled, end = settled_pieces(answer, at)
            found = _quoted(settled, self.context, found)
            if len(answer) >= len(self._answer):
                self._answer, self._settled, self._found = answer, end, found
        any_quote, all_claimed = _quoted(pieces(answer[end:]), self.context, found)
        return any_quote and all_claimed


class _Aligned:
    """One answer sentence's changed copies (`sentence_conflicts`) and the comparisons they cost, once read."""

    __slots__ = ("read",)

    def __init__(self) -> None:
        self.read: tuple[list[Conflict], int] | None = None


class Aligning:
    """`conflicts` of the checks of one growing answer: each sentence is aligned once, and the comparisons it cost are
    kept, so that the bound (`MAX_COMPARED`) is counted over a check's sentences as a check alone counts it. A
    sentence that would take the count past it is aligned again from the count before it, and raises where that
    check would."""

    def __init__(self, context: Context, min_copy: float = 0.4) -> None:
        self.context = context
        self.min_copy = min_copy
        self._sentences: GrowingSentences[_Aligned] = GrowingSentences()

    def conflicts(self, answer: str) -> list[Conflict]:
        if not any(self.context.held):
            return []
        compared, found = 0, []
        for (start, end), sentence in self._sentences.read(answer, lambda start, end: _Aligned()):
            if sentence.read is None or compared + sentence.read[1] > MAX_COMPARED:
                counted = self.context.fresh(compared)
                sentence.read = (sentence_conflicts(answer, start, end, counted, self.min_copy),
                                 counted.compared - compared)
            compared += sentence.read[1]
            found += sentence.read[0]
        return found


def _as_quoted(sentence: str) -> str:
    """A sentence as quotes are compared: its words, lower-cased, without a list item's marker."""
    marker = LIST_MARKER.match(sentence)
    return " ".join(words(sentence[marker.end() if marker else 0:]))


def strongest(found: list[Conflict]) -> dict[str, float]:
    """Per kind, the strength of its strongest conflict (0 where there is none)."""
    return {kind: max((c.strength for c in found if c.kind == kind), default=0.0) for kind in KINDS}
