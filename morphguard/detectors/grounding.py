"""Grounding: which of the answer's content words the context never uses. No LLM call; milliseconds.

An answer made of the context's own words may still be wrong (a negation, a swapped entity), but a
number, a name or a content word that appears nowhere in the context is the commonest trace of invented
content. Words the question supplies count as supported: an answer restating what was asked takes them from
there. Per answer sentence this detector lists those words with their offsets; the answer's score
grows with how many there are, numbers and names weighing more. Its counts are also exposed as
`Detection.features`, for checks that combine it with a judge.

Matching is deliberately forgiving, so that rewording is not mistaken for invention: case is ignored,
simple inflections are stripped (`trimesters` ≈ `trimester`, `advised` ≈ `advise`), `1,000` = `1000`,
number words equal their digits, a hyphenated word is grounded when each of its parts is, and a
camel-cased field name of a structured context (`OutdoorSeating`) offers its words. The registered rules
(`detectors/rules`) add what counting cannot see: claims stated against a fact the context holds, such as a JSON
record's yes/no field or its opening hours.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from morphguard.config import GroundingSettings
from morphguard.detectors.alignment import VERSION as ALIGNMENT_VERSION
from morphguard.detectors.alignment import Aligning, Conflict, Context, Quoting, quotable, strongest
from morphguard.detectors.injection import instructions
from morphguard.detectors.memo import current
from morphguard.detectors.registry import DetectorSpec, register
from morphguard.detectors.rules import fingerprint as rules_fingerprint
from morphguard.detectors.rules import read_all
from morphguard.detectors.text import (
    IGNORED,
    LIST_MARKER,
    NUMBER_WORDS,
    TOKEN,
    GrowingSentences,
    keys,
    sentences,
    vocabulary,
)
from morphguard.lanes import in_thread
from morphguard.models import Cost, Detection, DetectionStats, Factoid, RagInput

T = TypeVar("T")


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


@dataclass(frozen=True)
class Reading:
    """What grounding read of one answer that other detectors read too, so that a check running several of them
    reads the text once: each sentence's unsupported words (`ungrounded`) and the changed copies
    (`alignment.conflicts`; None where the answer is about a record and they were not looked for)."""

    sentences: list[SentenceReport]
    changed: list[Conflict] | None


def missing_words(words: list[Word], shown: int = 8) -> str:
    """A reviewer's reason for an unsupported claim: the words of it the context does not contain."""
    unique = list(dict.fromkeys(w.text for w in words))
    more = f" and {len(unique) - shown} more" if len(unique) > shown else ""
    return "not in the context: " + ", ".join(unique[:shown]) + more if unique else "not stated by the context"


def changed_copy(found: list[Conflict]) -> str:
    """A reviewer's reason for a changed copy: which kinds of change it makes to its context sentence."""
    kinds = ", ".join(dict.fromkeys(c.kind for c in found))
    return f"copies a context sentence but changes it ({kinds})"


# Words after which a number names a part of the context rather than stating a fact
REFERENCES = frozenset({"passage", "passages", "document", "documents", "source", "sources"})
# Words an assistant addresses its user with ("Sure, I'd be happy to", "Unable to answer"): no claim about the world
ADDRESS = frozenset("sure certainly happy glad hope i'd i'll i've here's unable".split())


class Kept:
    """What grounding keeps of the checks of one growing answer (a stream's, `memo.Memo`): what it read of the context
    (read again only where a check reads other passages, cut to fit `max_text_chars`) and of each sentence of the
    answer (its report, where it addresses its checker, its changed copies and whether it quotes the context), so
    that each check reads only what the answer added. The registered rules still read each check's whole answer: on
    a context of prose they read none of it, and on a record `records` points at a claim with up to 500 characters
    around it (`claim_around`), which text appended later may change."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._key: int | None = None
        self._context: dict[str, Any] = {}

    def context(self, rag: RagInput, name: str, read: Callable[[], T]) -> T:
        """What `read` makes of the check's context (its passages and question), by `name`: read once."""
        key = hash((rag.question, *rag.passages))
        with self._lock:
            if key != self._key:
                self._key, self._context = key, {}
            if name not in self._context:
                self._context[name] = read()
            found: T = self._context[name]
            return found

    def sentences(self, rag: RagInput, answer: str) -> list[tuple[SentenceReport, list[tuple[int, int]]]]:
        """Each sentence's report (`ungrounded`) and the places in it where the answer addresses its checker."""
        known = self.context(rag, "vocabulary", lambda: vocabulary([*rag.passages, rag.question]))
        growing: GrowingSentences[tuple[SentenceReport, list[tuple[int, int]]]] = self.context(
            rag, "sentences", GrowingSentences)  # read against that vocabulary
        read = growing.read(answer, lambda start, end: (sentence_report(answer, start, end, known),
                                                        instructions(answer, start, end)))
        return [found for _, found in read]

    def changed(self, rag: RagInput, answer: str) -> list[Conflict]:
        """`alignment.conflicts` of the answer, each sentence aligned once (`alignment.Aligning`)."""
        return self.context(rag, "aligned", lambda: Aligning(Context(rag.passages))).conflicts(answer)

    def quotes(self, rag: RagInput, answer: str) -> bool:
        """`alignment.quotes_context` of the answer, each of its settled pieces read once."""
        return self.context(rag, "quoting", lambda: Quoting(quotable(rag.passages))).quotes(answer)


def ungrounded(answer: str, passages: list[str], question: str = "",
               known: set[str] | None = None) -> list[SentenceReport]:
    """Per answer sentence: its content words, and those neither the context nor the question contains. An answer
    that restates the question ("No, pregnant women should not take ibuprofen for back pain") takes its words from
    there, so they are no invented content; what it claims with them is the judge's to check."""
    if known is None:  # `known`: the vocabulary of these passages and question, read already
        known = vocabulary([*passages, question])
    return [sentence_report(answer, start, end, known) for start, end in sentences(answer)]


def sentence_report(answer: str, start: int, end: int, known: set[str]) -> SentenceReport:
    """One sentence's report (`ungrounded`): what it reads of the answer is `answer[start:end]` alone."""
    content = 0
    missing: list[Word] = []
    seen: set[str] = set()
    # A list item's number ("5. Add the eggs") numbers the answer's own list, and the word after it opens the item
    marker = LIST_MARKER.match(answer, start, end)
    begin = marker.end() if marker else start
    previous = ""
    for match in TOKEN.finditer(answer, begin, end):
        token = match.group()
        word = token.lower().replace("’", "'")
        before, previous = previous, word
        if word in IGNORED or word in ADDRESS or len(token) == 1 and not token.isdigit():
            continue
        if token[0].isdigit() and before in REFERENCES:  # "Passage 2" points into the context, claims nothing
            continue
        content += 1
        wanted = keys(token)
        if all(k in known for k in wanted) or "".join(wanted) in known:
            continue
        if token.lower() in seen:
            continue
        seen.add(token.lower())
        first = match.start() == begin
        kind = ("number" if token[0].isdigit() or token.lower() in NUMBER_WORDS
                else "name" if token[0].isupper() and not first else "word")
        missing.append(Word(token, match.start(), match.end(), kind))
    return SentenceReport(start, end, content, missing)


# A sentence at least this share of whose content words the context lacks is itself the unsupported claim. In one
# that mostly rewords the context a stray content word is more often rewording than invention, but a number or a name
# the context lacks is a fact of its own. Pointing so rather than from every sentence's first unsupported word to its
# last was chosen on the RAGTruth QA and Summary fit halves (docs/evaluation-log.md, 2026-11-25, "where `grounding`
# points"); the counts, and so every score, are the same either way.
INVENTED_SHARE = 0.5


def unsupported_claim(report: SentenceReport) -> tuple[int, int] | None:
    """The part of a sentence to point at for what the context lacks: the whole sentence where most of its content
    is unsupported, else its unsupported numbers and names (from the first to the last), else none."""
    if report.content and len(report.unsupported) >= INVENTED_SHARE * report.content:
        return report.start, report.end
    facts = [w for w in report.unsupported if w.kind != "word"]
    return (facts[0].start, facts[-1].end) if facts else None


class Grounding:
    name = "grounding"

    def __init__(self, settings: GroundingSettings, threshold: float = 0.5) -> None:
        self.settings = settings
        self.threshold = threshold

    def weight(self, words: list[Word], changed: Sequence[Conflict] = ()) -> float:
        weights = {"number": self.settings.number_weight, "name": self.settings.name_weight, "word": 1.0}
        return (sum(weights[w.kind] for w in words)
                + self.settings.conflict_weight * sum(c.strength for c in _per_sentence(changed)))

    def _score(self, weight: float) -> float:
        return 1.0 - math.exp(-weight / self.settings.scale)

    async def detect(self, rag: RagInput, answer: str) -> Detection:
        # Milliseconds for a usual context, seconds of pure Python for a hostile multi-megabyte one: off the
        # event loop, so that one such request cannot stall the proxy's others.
        return await in_thread(self.measure, rag, answer, size=rag.size(answer))

    def measure(self, rag: RagInput, answer: str) -> Detection:
        return self.read(rag, answer)[0]

    def read(self, rag: RagInput, answer: str) -> tuple[Detection, Reading]:
        """The detection (`measure`) and what it read on the way (`Reading`)."""
        started = time.perf_counter()
        memo = current()
        kept = memo.of(self.name, Kept) if memo is not None else Kept()
        read = kept.sentences(rag, answer)
        reports = [report for report, _ in read]
        ruled = read_all(answer, rag.passages)
        misread = ruled.conflicts
        # An answer about a record is read against its fields, not sentence by sentence: the record's
        # "sentences" are JSON, so a changed copy of one means nothing (on the Data2txt fit half, n 192, the
        # negated-copy signal ranked against the labels, 0.45). Its unsupported words still count, but are
        # not pointed at: prose about a record rewords half its field names, and pointing at them gave span
        # F1 0.09 there, the clauses that state a field against its value 0.35.
        # Records alone, not a record beside prose (`rules.Reading.facts`): one JSON passage slipped into a context
        # of prose must not change how the prose is read (nor, in `combined`, keep the judge from reading it).
        about_record = ruled.about_facts
        changed = [] if about_record else kept.changed(rag, answer)
        planted = [place for _, places in read for place in places]
        missing = [w for r in reports for w in r.unsupported]
        content = sum(r.content for r in reports)
        score = self._score(self.weight(missing, changed) + self.settings.conflict_weight * len(misread)
                            + self.settings.instruction_weight * bool(planted))
        by_sentence: dict[int, list[Conflict]] = {}  # looked up per sentence: a scan per sentence grows with the square
        for c in changed:
            by_sentence.setdefault(c.start, []).append(c)
        factoids = []
        for r in reports:
            own = by_sentence.get(r.start, [])
            if own:  # a changed copy: the whole sentence is the claim in question
                factoids.append(Factoid(text=answer[r.start:r.end], start=r.start, end=r.end, label="contradicted",
                                        score=self._score(self.weight(r.unsupported, own)),
                                        evidence=[own[0].evidence], reason=changed_copy(own)))
            elif not about_record and (claim := unsupported_claim(r)):
                start, end = claim
                factoids.append(Factoid(text=answer[start:end], start=start, end=end, label="unsupported",
                                        score=self._score(self.weight(r.unsupported)),
                                        reason=missing_words(r.unsupported)))
        factoids += [Factoid(text=answer[m.start:m.end], start=m.start, end=m.end, label="contradicted",
                             score=self._score(self.settings.conflict_weight),
                             evidence=[m.evidence] if m.evidence else [], reason=m.reason) for m in misread]
        factoids += [Factoid(text=answer[a:b], start=a, end=b, label="unsupported",
                             score=self._score(self.settings.instruction_weight),
                             reason="addresses the checker: an instruction in the answer") for a, b in planted]
        features = {
            "content_words": float(content),
            "unsupported": float(len(missing)),
            "unsupported_numbers": float(sum(w.kind == "number" for w in missing)),
            "unsupported_names": float(sum(w.kind == "name" for w in missing)),
            "unsupported_share": len(missing) / content if content else 0.0,
            "worst_sentence_share": max((len(r.unsupported) / r.content for r in reports if r.content), default=0.0),
            **{f"{kind}_conflict": strength for kind, strength in strongest(changed).items()},
            "changed_copies": float(len(_per_sentence(changed))),
            "record_fields": float(ruled.facts) if about_record else 0.0,
            "record_conflicts": float(len(misread)),
            "instruction": float(bool(planted)),
            # every stating sentence is a context sentence as written: the combined check asks no judge about it
            "quoted": float(not about_record and not changed and kept.quotes(rag, answer)),
        }
        detection = Detection(
            detector=self.name, score=score, threshold=self.threshold, flagged=score >= self.threshold,
            factoids=factoids, features=features,
            cost=Cost.of({}, time.perf_counter() - started),
            stats=DetectionStats(factoids=len(factoids)),
            settings={"unsupported_words": [w.text for w in missing]},
        )
        return detection, Reading(reports, None if about_record else changed)


def _per_sentence(changed: Sequence[Conflict]) -> list[Conflict]:
    """One conflict per answer sentence (the first found): a sentence changed twice is one wrong claim."""
    return list({c.start: c for c in reversed(changed)}.values())


VERSION = 10  # of the word lists and matching rules above: a change makes earlier eval results stale

register(DetectorSpec(
    name="grounding", settings=GroundingSettings, models=lambda settings: [],
    fingerprint=lambda settings: {"options": settings.model_dump(), "version": VERSION,
                                  "alignment": ALIGNMENT_VERSION, **rules_fingerprint()},
    build=lambda settings, threshold, llm: Grounding(settings, threshold)))
