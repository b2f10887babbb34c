"""Text as matching sees it: the spellings a client can vary without changing what a reader, a model or a
provider understands, written one way.

`fold` is for recognising words (the topic tagger): "pregnant" stays "pregnant" when it is written with a
zero-width space or a soft hyphen inside, in fullwidth or mathematical letters, with Cyrillic or Greek
letters that look like Latin ones, with accents, or in any case. In order:

1. HTML character references are decoded (`preg&shy;nant`, `&#112;regnant`), as a browser would;
2. NFKD: compatibility forms become their plain letters (fullwidth `ｐ`, mathematical `𝐩`, ligatures) and
   accented letters split into letter and mark;
3. default-ignorable characters (format characters such as ZWSP, ZWJ, soft hyphen, word joiner, bidi
   controls; variation selectors; the Hangul fillers) and combining marks are dropped, and every dash
   (Unicode `Pd`) becomes `-`;
4. letters of other scripts that Unicode's confusables data (UTS #39, through the `confusable-homoglyphs`
   package) lists as looking like one Latin letter become that letter: Cyrillic `е`, `а`, `р`, `о`, `с`,
   Greek `ο`, `ρ`, capitals such as `Н`, `Т`, `Κ`, `Ν`; a capital and its small letter alike, so that
   text in those scripts still folds case-insensitively (`_readings` says how; the three Greek pairs whose
   forms look like different letters are read both ways);
5. case folding.

Everything here is one pass of C-implemented string functions over the text (linear, no backtracking);
ASCII text, the common case, skips to lower-casing. It is for matching only: nothing folded is shown,
stored or sent.

`model_names` does the same for a model name, minus the look-alikes (a provider resolves names exactly, so a
look-alike is another, unknown model): NFKC, format characters dropped, case folded, surrounding space
removed; and the name without a provider prefix (`openai/gpt-4o` is also `gpt-4o`), since routers in
front of providers (litellm, OpenRouter) treat both as the same model.
"""

from __future__ import annotations

import html
import re
import unicodedata
from dataclasses import dataclass
from functools import cache

# Default-ignorable code points (Unicode DerivedCoreProperties) that are not format characters or marks.
_IGNORABLE_LETTERS = (0x115F, 0x1160, 0x3164, 0xFFA0)  # Hangul fillers: letters that show nothing
_IGNORABLE_RANGES = ((0xFFF0, 0xFFF8), (0xE0000, 0xE0FFF))  # reserved as default-ignorable
_DROPPED = frozenset({"Cf", "Mn", "Me"})


@dataclass(frozen=True)
class _Tables:
    first: dict[int, str | None]  # str.translate tables of steps 3 and 4; they differ only on the letters of
    second: dict[int, str | None]  # `twofold`, read as the capital looks in `first` and as the small one does
    twofold: re.Pattern[str]  # in `second`


@cache
def _tables() -> _Tables:
    """Built once per process (~0.5 s)."""
    readings, conflicts = _readings()
    first: dict[int, str | None] = {}
    second: dict[int, str | None] = {}
    for point in range(0x110000):
        char = chr(point)
        category = unicodedata.category(char)
        if category in _DROPPED:
            first[point] = second[point] = None
        elif category == "Pd" and point != 0x2D:
            first[point] = second[point] = "-"
        else:
            # Any other letter whose case folding is a look-alike (Greek final `ς` folds to `σ`) reads as that.
            small = char.casefold() if char not in readings else char
            if small in readings:
                first[point], second[point] = readings[small]
                if small in conflicts:
                    conflicts.add(char)
    for point in (*_IGNORABLE_LETTERS, *(p for low, high in _IGNORABLE_RANGES for p in range(low, high + 1))):
        first[point] = second[point] = None
    twofold = re.compile("[" + "".join(re.escape(c) for c in sorted(conflicts)) + "]") if conflicts \
        else re.compile("(?!)")
    return _Tables(first, second, twofold)


def _plain(text: str) -> str:
    """NFKD without marks and format characters, case folded: how a look-alike's Latin letter is read."""
    return "".join(c for c in unicodedata.normalize("NFKD", text)
                   if unicodedata.category(c) not in _DROPPED).casefold()


def _lookalikes() -> dict[str, str]:
    """Non-ASCII characters that NFKD leaves alone and that look like one Latin letter: that letter."""
    from confusable_homoglyphs import confusables

    found: dict[str, str] = {}
    for key, entries in confusables.confusables_data.items():
        for entry in entries:
            glyph = entry["c"]
            for source, target in ((key, glyph), (glyph, key)):  # the data lists look-alikes both ways
                if len(source) != 1 or source.isascii() or unicodedata.normalize("NFKD", source) != source:
                    continue
                latin = _plain(target)
                if len(latin) == 1 and latin.isascii() and latin.isalpha():
                    found.setdefault(source, latin)
    return found


def _readings() -> tuple[dict[str, tuple[str, str]], set[str]]:
    """Each look-alike's Latin letter, the same for a capital and its small letter, so that case folding (which
    comes after) still makes them one: a letter without a look-alike of its own takes its partner's (Cyrillic
    `т` is `t`, like `Т`; `г` is `r`, so `Г` is too), and a capital that looks like `I` (which Unicode reads
    as `l`) is `i` when its small letter is (Cyrillic `І`, `і`). Where the two look like different letters
    (Greek `Ν` and `ν`, `Η` and `η`, `Υ` and `υ`) the pair is read both ways: the capital's in the first
    reading, the small letter's in the second, and the text is read twice when it has one of them."""
    found = _lookalikes()
    pairs: set[tuple[str, str]] = set()
    for letter in found:
        small, capital = letter.casefold(), letter.upper()
        if small != letter and len(small) == 1:
            pairs.add((letter, small))
        elif capital != letter and len(capital) == 1 and capital.casefold() == letter:
            pairs.add((capital, letter))
    readings = {letter: (latin, latin) for letter, latin in found.items()}
    conflicts: set[str] = set()
    for capital, small in pairs:
        if capital.isascii() or small.isascii():
            continue  # a Latin partner (dotless `ı` and `I`) is folded by case folding alone
        big, little = found.get(capital), found.get(small)
        if big is None or little is None or big == little:
            latin = big or little
            assert latin is not None
            readings[capital] = readings[small] = (latin, latin)
        elif big == "l" and little == "i":
            readings[capital] = readings[small] = ("i", "i")
        else:
            readings[capital] = readings[small] = (big, little)
            conflicts |= {capital, small}
    return readings, conflicts


def foldings(text: str) -> list[str]:
    """`text` as the topic tagger reads it (see the module's description): one reading, or two when it has a
    letter whose capital and small forms look like different Latin letters."""
    if "&" in text:
        text = html.unescape(text)
    if text.isascii():
        return [text.lower()]
    tables = _tables()
    decomposed = unicodedata.normalize("NFKD", text)
    out = [decomposed.translate(tables.first).casefold()]
    if tables.twofold.search(decomposed):
        out.append(decomposed.translate(tables.second).casefold())
    return out


def fold(text: str) -> str:
    """The first reading of `foldings`: how keywords are written before they are matched."""
    return foldings(text)[0]


def warm() -> None:
    """Build the tables now (at start-up) rather than on the first request."""
    _tables()


def model_name(name: str) -> str:
    """A model name as routes and metric labels compare it: NFKC, format characters dropped, case folded."""
    if not name.isascii():
        name = "".join(c for c in unicodedata.normalize("NFKC", name) if unicodedata.category(c) != "Cf")
    return name.strip().casefold()


def model_names(name: str) -> tuple[str, ...]:
    """The normalised name, and the same without its provider prefix (`openai/gpt-4o`: also `gpt-4o`)."""
    full = model_name(name)
    bare = full.rsplit("/", 1)[-1].strip()
    return (full, bare) if bare and bare != full else (full,)
