"""The combined check: the judge's verdicts and the grounding counts, weighed by a small fitted model.

Up to five parts look at the answer: `grounding` (no call: content words neither the context nor the question uses,
copied sentences changed where a copy goes wrong, JSON record fields stated against their value, instructions to the
checker) and, when the weights read them, `direct` (one call: is the whole answer supported?), `restatement` (one
short call per changed copy: does the copy say what its source says?), `spotcheck` (one short call: does the context
state the sentence grounding trusts least?) and the judge's per-factoid check (`metarag:factoids`). They fail on
different answers: the words of a negated claim are all in the context, while a small judge waves through invented
detail it finds plausible. Their signals are the features of five channels, each a logistic regression fitted by
`morphguard eval --fit` (`combined.json`; `combined_fast.json`, without `direct`, for the `fast` profile), joined by
noisy-OR and calibrated into the probability that the answer is hallucinated.

Beside the weights, each file holds the figures chosen with them for its judge (`Tuning`): the floors that raise an
answer that addresses its checker or a short answer that is a changed copy, and the cascade's band and short-context
limit, which decide when `direct` is asked and which calibration reads an answer. The config's `combined.cascade` and
`combined.short_context` replace the file's where set (`tuned`). Every step that moves the score (the cascade's
branch, the calibration, a floor) is recorded in the detection's `explanation` with the score before and after.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Awaitable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, field_validator

from morphguard.config import FITTED, CombinedSettings
from morphguard.detectors.alignment import KINDS as CONFLICT_KINDS
from morphguard.detectors.alignment import VERSION as ALIGNMENT_VERSION
from morphguard.detectors.baselines import DirectJudge
from morphguard.detectors.grounding import VERSION as GROUNDING_VERSION
from morphguard.detectors.grounding import Grounding, GroundingSettings, Reading
from morphguard.detectors.logistic import log_odds, sigmoid
from morphguard.detectors.metarag import PROFILES, MetaRAG
from morphguard.detectors.registry import DetectorSpec, register
from morphguard.detectors.restatement import RestatementJudge, RestatementSettings
from morphguard.detectors.rules import fingerprint as rules_fingerprint
from morphguard.detectors.spotcheck import PLAN_VERSION as SPOTCHECK_PLAN
from morphguard.detectors.spotcheck import SpotCheck, SpotCheckSettings
from morphguard.detectors.text import statements
from morphguard.lanes import in_thread
from morphguard.llm.client import LLMClient, together
from morphguard.models import Cost, Detection, DetectionStats, Factoid, RagInput, StageCost

# The judge parts, by the names `eval` records their outcomes under. Grounding, which costs nothing, is recomputed
# from the item itself. A part is asked only when the weights read it.
PARTS = ("direct", "restatement", "spotcheck", "metarag:factoids")
SHIPPED_PARTS = ("direct", "restatement", "spotcheck")  # the shipped weights' parts; `eval --fit`'s default
JUDGE_FEATURES = ("direct", "restatement", "spotcheck", "factoid_max")  # their scores, as `features` names them
# The shipped weights, by profile (`combined:fast`, or `combined: {profile: fast}` in the config). `fast` leaves out
# `direct`, whose whole-context read takes most of a check's time on the embedded judge.
WEIGHT_FILES = {"": "combined.json", "fast": "combined_fast.json"}
# Characters of context the direct part reads (the sentences most relevant to the answer first): about 4,000 tokens,
# half the embedded judge's window, so that a long context is cut rather than the check failing.
DIRECT_CONTEXT_BUDGET = 16_000


def features(direct: float | None, restatement: float | None, factoid_scores: Sequence[float] | None,
             grounding: Mapping[str, float], spotcheck: float | None = None) -> dict[str, float]:
    """The model's inputs, from what the parts said: the same function at fit time and at check time.
    A part None: it did not run (weights fitted without it never ask for it)."""
    judged = {}
    if direct is not None:
        judged["direct"] = direct
    if restatement is not None:
        judged["restatement"] = restatement
    if spotcheck is not None:
        judged["spotcheck"] = spotcheck
    if factoid_scores is not None:
        judged["factoid_max"] = max(factoid_scores, default=0.0)
    return {**judged, **vocabulary_features(grounding)}


def undoubted(grounding: Mapping[str, float], read: Collection[str]) -> dict[str, float]:
    """The inputs of an answer that quotes its context (grounding's `quoted`): each judge part in `read` (by its
    `JUDGE_FEATURES` name) as if asked and finding nothing unsupported. A judge asked about the context's own
    sentences can only be wrong, so none is."""
    return features(0.0 if "direct" in read else None, 0.0 if "restatement" in read else None,
                    [] if "factoid_max" in read else None, grounding, 0.0 if "spotcheck" in read else None)


def vocabulary_features(grounding: Mapping[str, float]) -> dict[str, float]:
    """The inputs that need no judge: what grounding counted."""
    return {
        "unsupported": math.log1p(grounding.get("unsupported", 0.0)),
        "unsupported_numbers": math.log1p(grounding.get("unsupported_numbers", 0.0)),
        "unsupported_names": math.log1p(grounding.get("unsupported_names", 0.0)),
        "negation_conflict": grounding.get("negation_conflict", 0.0),
        "number_conflict": grounding.get("number_conflict", 0.0),
        "record_conflicts": math.log1p(grounding.get("record_conflicts", 0.0)),
        # The yes/no fields of a context made of records alone (0 for prose, or a record beside prose): no channel
        # reads it, it says which channels are asked.
        "record_fields": grounding.get("record_fields", 0.0),
    }


# Five channels, each a logistic regression of its own: invented content (words, numbers and names neither the context
# nor the question uses), contradicted content (a changed copy the judge says differs from its source, a negated copy,
# a copy with one number put in another's place), the judge's NO on the whole answer, its NO on the sentence grounding
# trusts least, and misread facts (a claim a registered rule finds stated against a fact of the context,
# detectors/rules; every word of such a claim is the context's own, so the invented channel cannot see it). Any
# channel can raise the probability on its own: P = 1 - (1 - P_a)(1 - P_b)...(1 - P_e). Kept apart, one kind of
# evidence cannot switch off another's weight in the fit. How the designs compare: benchmarks/combined_designs.py and
# docs/evaluation-log.md.
CHANNELS = {
    "invented": ("unsupported", "unsupported_numbers", "unsupported_names"),
    "contradicted": ("restatement", "negation_conflict", "number_conflict"),
    "judged": ("direct", "factoid_max"),
    "spotted": ("spotcheck",),
    "misread": ("record_conflicts",),
}
UNJUDGED_CHANNELS = ("invented", "misread")  # read no judge's output, so learn from answers no judge has read
RECORD_ONLY = ("misread",)  # evidence only where the context holds a record: not asked about prose


def reads(channel: str, record: bool, records_apart: bool) -> bool:
    """Whether `channel` reads an answer (about a record or not). With the records apart, an answer about a record
    gets the channels that need no judge, and prose the others but the record's own (on prose it could only add a
    constant); without, every channel reads every answer. `eval --fit` teaches each channel the same answers."""
    if not records_apart:
        return True
    return channel in UNJUDGED_CHANNELS if record else channel not in RECORD_ONLY


class Channel(BaseModel):
    """A fitted logistic regression over standardised features."""

    features: list[str]
    mean: list[float]
    scale: list[float]
    coef: list[float]
    intercept: float

    def _terms(self, values: Mapping[str, float]) -> dict[str, float]:
        return {f: c * (values[f] - m) / s
                for f, m, s, c in zip(self.features, self.mean, self.scale, self.coef, strict=True)}

    def probability(self, values: Mapping[str, float]) -> float:
        return sigmoid(self.intercept + sum(self._terms(values).values()))


class ChangedCopyFloor(BaseModel):
    """A short answer (at most `short_answer` stating sentences) that copies a context sentence at least `closeness`
    closely but changes it where a copy goes wrong (detectors/alignment.py) is raised to at least `floor`. The
    channels, fitted on whole answers where such changes also turn up in faithful paraphrases, do not learn it."""

    floor: float = Field(ge=0, le=1)
    closeness: float = Field(ge=0, le=1)
    short_answer: int = Field(ge=1)


class Tuning(BaseModel):
    """The figures chosen beside the weights, for the judge named in `judge`: read from the weights file that scores
    the answer (the shipped default's where it has none). `eval --fit` fits the channels, not these: the file it
    writes carries the tuning it ran with, and the judge that tuning was chosen for."""

    judge: dict[str, Any]
    instruction_floor: float = Field(ge=0, le=1)  # the least score of an answer that addresses its checker
    changed_copy: ChangedCopyFloor
    # `direct` reads the whole context, most of a check's time on the embedded judge, and changes little but the
    # answers the other parts leave near the thresholds. So the other parts answer first, and the cascade asks `direct`
    # only where their probability by the first stage's weights (fitted without it) lies in [low, high)
    # (`combined.cascade`); elsewhere that probability is the answer's. An empty band (low = high): `direct` is asked
    # over a short context only. None: weights that do not read `direct`, or every part asked at once.
    cascade: tuple[float, float] | None
    # Characters of context up to which a context is short (`combined.short_context`): `direct` reads it in a few
    # seconds, so the cascade asks it at once with the other parts, and `Weights.short_calibration` reads the answer.
    short_context: int = Field(ge=0)

    @field_validator("cascade")
    @classmethod
    def _band(cls, band: tuple[float, float] | None) -> tuple[float, float] | None:
        if band is not None and not 0.0 <= band[0] <= band[1] <= 1.0:
            raise ValueError("a cascade band is [low, high] with 0 <= low <= high <= 1")
        return band


class Weights(BaseModel):
    """The fitted channels, their joint calibration, what they were fitted on, and the constants chosen with them."""

    channels: dict[str, Channel]
    # Each channel alone learns the overall error rate, so their noisy-OR counts it twice; a last logistic over
    # the noisy-OR's log-odds (slope, intercept) makes the result a probability again. Monotone: it changes no ranking.
    calibration: tuple[float, float] = (1.0, 0.0)
    # Answers about a structured record (a context of JSON records alone with yes/no fields: `record_fields`,
    # detectors/rules/records.py): the small judge reads prose, not records, so where this is set such answers are
    # scored by the channels that need no judge, with this calibration, and the judge is not asked. None: every
    # answer is scored by every channel.
    record_calibration: tuple[float, float] | None = None
    # Answers over a short context (`Tuning.short_context`: a paragraph, not a retrieved page), where every part reads
    # the whole context and the channels' verdict means more than over a long one (`eval --fit --recalibrate`).
    # None: they take `calibration`.
    short_calibration: tuple[float, float] | None = None
    fitted_on: dict[str, Any] = {}
    tuning: Tuning | None = None  # None: the shipped default's (`TUNING`, from combined.json); a check reads `tuned`

    @property
    def features(self) -> set[str]:
        return {f for channel in self.channels.values() for f in channel.features}

    def reads_record(self, grounding: Mapping[str, float]) -> bool:
        """Whether an answer with these grounding features is scored without the judge."""
        return self.record_calibration is not None and grounding.get("record_fields", 0.0) > 0

    def _channels(self, record: bool) -> dict[str, Channel]:
        return {n: c for n, c in self.channels.items() if reads(n, record, self.record_calibration is not None)}

    def either(self, values: Mapping[str, float], record: bool = False) -> float:
        """Noisy-OR of the channels: the answer is faithful only if no channel finds an error."""
        return 1.0 - math.prod(1.0 - channel.probability(values) for channel in self._channels(record).values())

    def probability(self, values: Mapping[str, float], record: bool = False, short: bool = False) -> float:
        """The calibrated probability of an answer (about a record, over a short context, or neither)."""
        return self.calibrated(self.either(values, record), record, short)[0]

    def calibrated(self, either: float, record: bool = False, short: bool = False) -> tuple[float, str]:
        """The channels' noisy-OR made a probability, and the name of the calibration that did it."""
        if record and self.record_calibration:
            name, (slope, intercept) = "record", self.record_calibration
        elif short and self.short_calibration:
            name, (slope, intercept) = "short-context", self.short_calibration
        else:
            name, (slope, intercept) = "long-context" if self.short_calibration else "the", self.calibration
        return sigmoid(slope * log_odds(either) + intercept), name

    def contributions(self, values: Mapping[str, float], record: bool = False) -> dict[str, float]:
        """Each channel's probability, and how much each feature moved that channel's log-odds
        (`channel.feature`), for explaining a verdict."""
        out: dict[str, float] = {}
        for name, channel in self._channels(record).items():
            out[name] = round(channel.probability(values), 3)
            out |= {f"{name}.{f}": round(v, 3) for f, v in channel._terms(values).items()}
        return out


@dataclass(frozen=True)
class Step:
    """One step that moved a check's score: what it is, the score before and after, and why it applied."""

    name: str  # calibration | cascade | instruction_floor | changed_copy_floor | quoted | record
    before: float
    after: float
    why: str

    def record(self) -> dict[str, Any]:
        """As a detection's `explanation` holds it: the numbers, and a line a reviewer reads."""
        return {"step": self.name, "before": round(self.before, 4), "after": round(self.after, 4),
                "text": f"{self.why}: {self.before:.3f} -> {self.after:.3f}"}


def scored(weights: Weights, values: Mapping[str, float], grounding: Mapping[str, float], short_copy: bool,
           short: bool = False) -> tuple[float, list[Step]]:
    """What the weights make of the features (over a short context if `short`), then the floors: an answer that tells
    its checker what to conclude is suspect whatever the parts say, and a short changed copy is a wrong claim the
    channels do not learn (`ChangedCopyFloor`). Each floor is joined by noisy-OR, which keeps the raised answers in the
    order the evidence puts them. With every step that moved the score."""
    tuning = weights.tuning or TUNING
    record = weights.reads_record(grounding)
    either = weights.either(values, record)
    score, calibration = weights.calibrated(either, record, short)
    steps = [Step("calibration", either, score, f"{calibration} calibration of the channels' noisy-OR")]
    if grounding.get("instruction"):
        raised = 1.0 - (1.0 - score) * (1.0 - tuning.instruction_floor)
        steps.append(Step("instruction_floor", score, raised,
                          f"instruction floor {tuning.instruction_floor:g} (the answer addresses its checker)"))
        score = raised
    if short_copy:
        floor = tuning.changed_copy.floor
        raised = 1.0 - (1.0 - score) * (1.0 - floor)
        steps.append(Step("changed_copy_floor", score, raised,
                          f"changed-copy floor {floor:g} (a short answer copies a context sentence but changes it)"))
        score = raised
    return score, steps


def answer_probability(weights: Weights, values: Mapping[str, float], grounding: Mapping[str, float],
                       short_copy: bool, short: bool = False) -> float:
    """The answer's probability (`scored`), without its steps."""
    return scored(weights, values, grounding, short_copy, short)[0]


def short_changed_copy(answer: str, grounding: Mapping[str, float], rule: ChangedCopyFloor | None = None) -> bool:
    """Whether `answer` is short and copies a context sentence closely with a change (`ChangedCopyFloor`; default:
    the shipped one)."""
    rule = rule or TUNING.changed_copy
    closest = max(grounding.get(f"{kind}_conflict", 0.0) for kind in CONFLICT_KINDS)
    return closest >= rule.closeness and len(statements(answer, rule.short_answer + 1)) <= rule.short_answer


def load_weights(path: str | None, profile: str = "") -> Weights:
    """A weights file written by `eval --fit`, or (`path` None) the profile's shipped one."""
    if path:
        text = Path(path).read_text(encoding="utf-8")
    else:
        text = resources.files("morphguard.detectors").joinpath(WEIGHT_FILES[profile]).read_text(encoding="utf-8")
    return Weights.model_validate(json.loads(text))


def _shipped_tuning() -> Tuning:
    tuning = load_weights(None).tuning
    if tuning is None:
        raise RuntimeError("the shipped combined.json holds no tuning")
    return tuning


# The figures chosen with the shipped default weights: those of any weights file without its own `tuning`.
TUNING = _shipped_tuning()


def tuned(settings: CombinedSettings, weights: Weights | None = None) -> Tuning:
    """The figures a check configured by `settings` runs with: its weights file's `tuning` (`weights`, default the
    file `settings` names), with the config's `cascade` and `short_context` in place of the file's where they are not
    "fitted". The check, `eval --fit` and `eval --rescore` read them here (the benchmarks, which read the shipped
    check, `TUNING`)."""
    weights = weights or load_weights(settings.weights, settings.profile)
    given = {"cascade": settings.cascade, "short_context": settings.short_context}
    return (weights.tuning or TUNING).model_copy(update={k: v for k, v in given.items() if v != FITTED})


def cascade_band(settings: CombinedSettings, weights: Weights | None = None) -> tuple[float, float] | None:
    """The band in which the check holds `direct` back (`tuned`); None: every part is asked at once, because no band
    is set, the weights do not read `direct`, or weights of one's own have no first stage of one's own
    (`CombinedSettings.cascaded`)."""
    weights = weights or load_weights(settings.weights, settings.profile)
    if not settings.cascaded or "direct" not in weights.features:
        return None
    return tuned(settings, weights).cascade


@dataclass(frozen=True)
class TextEvidence:
    """What the text of one check says without a judge, read once: grounding's measure (unsupported words, changed
    copies, records, instructions, quotes), whether the answer is a short changed copy, and whether its context is
    short. The check, `eval --rescore` and `eval --fit` all read an answer through this and `judged_values`."""

    grounding: Detection
    short_copy: bool  # `short_changed_copy`
    short: bool  # `short_context`
    reading: Reading  # what grounding read on the way, handed to the judge parts that read the same

    @property
    def features(self) -> dict[str, float]:
        return self.grounding.features

    @property
    def quoted(self) -> bool:
        """Every stating sentence is a context sentence as written: no judge is asked about it."""
        return bool(self.features.get("quoted"))

    def about_record(self, weights: Weights) -> bool:
        """Whether `weights` score the answer without the judge, as one about a structured record."""
        return weights.reads_record(self.features)

    def judged(self, weights: Weights) -> bool:
        """Whether the check asks the judge anything about the answer."""
        return not self.about_record(weights) and not self.quoted

    def staged(self, weights: Weights) -> bool:
        """Whether a cascade holds `direct` back for the answer (a first stage decides whether to ask it)."""
        return self.judged(weights) and not self.short


def read_text(rag: RagInput, answer: str, short_limit: int, rule: ChangedCopyFloor | None = None) -> TextEvidence:
    """The text evidence of one check (`TextEvidence`; `rule`: the weights' changed-copy floor, default the shipped
    one); pure Python over the whole context, so a caller on the event loop runs it in a thread."""
    grounded, reading = Grounding(GroundingSettings()).read(rag, answer)
    return TextEvidence(grounded, short_changed_copy(answer, grounded.features, rule),
                        short_context(rag.passages, short_limit), reading)


def judged_values(evidence: TextEvidence, judged: Mapping[str, float], read: Collection[str],
                  record: bool = False) -> dict[str, float]:
    """The fusion's inputs for one answer: what the judge parts said (`judged`, by their `JUDGE_FEATURES` names; a
    part absent did not run) with the text evidence. An answer about a record (`record`) reads the text alone; one
    that quotes its context reads as undoubted by every part in `read`."""
    if record:
        return vocabulary_features(evidence.features)
    if evidence.quoted:
        return undoubted(evidence.features, read)
    return features(judged.get("direct"), judged.get("restatement"),
                    [judged["factoid_max"]] if "factoid_max" in judged else None, evidence.features,
                    judged.get("spotcheck"))


def fused(weights: Weights, evidence: TextEvidence, values: Mapping[str, float], short: bool | None = None) -> float:
    """The answer's probability (`fusion`), without its steps."""
    return fusion(weights, evidence, values, short)[0]


def fusion(weights: Weights, evidence: TextEvidence, values: Mapping[str, float],
           short: bool | None = None) -> tuple[float, list[Step]]:
    """The answer's probability: `values` through `weights`, with the floors (`scored`), and the steps that moved it.
    `short`: which calibration reads it (default: the evidence's own; a cascade's first stage reads the long
    contexts')."""
    return scored(weights, values, evidence.features, evidence.short_copy, evidence.short if short is None else short)


def short_context(passages: Sequence[str], limit: int) -> bool:
    """Whether the context is short (`combined.short_context`): the cascade then asks `direct` at once, and the
    weights' `short_calibration` reads the answer."""
    return sum(len(p) for p in passages) <= limit


def asks_direct(first_stage: float, band: tuple[float, float]) -> bool:
    """Whether the cascade asks `direct` after its first stage gave this probability."""
    return band[0] <= first_stage < band[1]


class Combined:
    name = "combined"

    def __init__(self, llm: LLMClient, settings: CombinedSettings, threshold: float = 0.5) -> None:
        self.llm = llm  # the proxy's readiness probe looks for the judge here
        self.weights = load_weights(settings.weights, settings.profile)
        self.threshold = threshold
        tuning = tuned(settings, self.weights)
        # The first stage's weights where a cascade holds `direct` back, and its band; None: all at once.
        band = cascade_band(settings, self.weights)
        self.first = load_weights(settings.cascade_weights, "fast") if band is not None else None
        if self.first is not None and "direct" in self.first.features:
            raise ValueError("combined.cascade_weights must be fitted without direct (eval --fit --detector "
                             "restatement,spotcheck)")
        self.band = band or (0.0, 1.0)
        self.short_context = tuning.short_context
        self.changed_copy = tuning.changed_copy
        read = self.weights.features | (self.first.features if self.first else set())
        self.direct = (DirectJudge(llm, model=settings.model, context_budget=DIRECT_CONTEXT_BUDGET)
                       if "direct" in read else None)
        self.restatement = (RestatementJudge(llm, RestatementSettings(model=settings.model))
                            if "restatement" in read else None)
        self.spotcheck = (SpotCheck(llm, SpotCheckSettings(model=settings.model)) if "spotcheck" in read else None)
        self.factoids = (MetaRAG(llm, replace(PROFILES["factoids"], decompose_model=settings.model,
                                              verify_models=(settings.model,)))
                         if "factoid_max" in read else None)

    def _parts(self, rag: RagInput, answer: str, evidence: TextEvidence,
               held_back: bool) -> dict[str, Awaitable[Detection]]:
        """The checks of the judge parts there are (`direct` not where a cascade holds it back); restatement and
        the spot check are handed what grounding read of the answer rather than reading it again."""
        read = evidence.reading
        parts: dict[str, Awaitable[Detection]] = {}
        if self.direct is not None and not held_back:
            parts["direct"] = self.direct.detect(rag, answer)
        if self.restatement is not None:
            parts["restatement"] = self.restatement.detect(rag, answer, read.changed)
        if self.spotcheck is not None:
            parts["spotcheck"] = self.spotcheck.detect(rag, answer, read.sentences)
        if self.factoids is not None:
            parts["factoids"] = self.factoids.detect(rag, answer)
        return parts

    async def detect(self, rag: RagInput, answer: str) -> Detection:
        started = time.perf_counter()
        # Reading the text is pure Python over the whole context (a tenth of a second for a hostile 2 MB answer): off
        # the event loop, once for both stages.
        evidence = await in_thread(read_text, rag, answer, self.short_context, self.changed_copy,
                                   size=rag.size(answer))
        grounded = evidence.grounding
        record, quoted, short = evidence.about_record(self.weights), evidence.quoted, evidence.short
        held_back = self.first is not None and evidence.staged(self.weights)
        # The judge parts at once: an API judge answers them side by side, so a check waits for its slowest part
        # rather than for all of them in turn; the embedded judge's client queues them (llm/__init__.py). An
        # answer about a record asks none (Weights.record_calibration), nor does one that quotes its context.
        asked = await _all_at_once(self._parts(rag, answer, evidence, held_back)) if evidence.judged(
            self.weights) else {}
        weights, first_stage, branch = self.weights, None, []
        if held_back:
            assert self.first is not None
            first_stage = fused(self.first, evidence, judged_values(evidence, _said(asked), ()), short=False)
            band = f"[{self.band[0]:g}, {self.band[1]:g})"
            if asks_direct(first_stage, self.band) and self.direct is not None:
                asked["direct"] = await self.direct.detect(rag, answer)
                branch = [f"cascade: the first stage, without direct, lies in {band}, so direct was asked"]
            else:
                weights = self.first
                why = ("over a long context direct is not asked (an empty band)" if self.band[0] >= self.band[1]
                       else f"the first stage, without direct, lies outside {band}, so direct was not asked")
                branch = [f"cascade: {why}, and the first stage's weights score the answer"]
        direct, restated, spotted, factoids = (asked.get(k) for k in ("direct", "restatement", "spotcheck",
                                                                        "factoids"))
        values = judged_values(evidence, _said(asked), self.weights.features, record)
        score, steps = fusion(weights, evidence, values)
        explanation = [Step("cascade", first_stage, score, why).record() for why in branch if first_stage is not None]
        explanation += [step.record() for step in steps]
        stages: dict[str, StageCost] = {}
        judged: list[Factoid] = []
        if direct is not None:
            stages = {f"direct.{k}": v for k, v in direct.cost.stages.items()}
            judged = direct.factoids  # the parts the direct judge named as unsupported
        if restated is not None:
            stages |= {f"restatement.{k}": v for k, v in restated.cost.stages.items()}
            judged = judged + [f for f in restated.factoids if f.score > 0]
        if spotted is not None:
            stages |= {f"spotcheck.{k}": v for k, v in spotted.cost.stages.items()}
        if factoids is not None:
            stages |= {f"factoids.{k}": v for k, v in factoids.cost.stages.items()}
            judged = factoids.factoids
        unparseable = sum(part.stats.unparseable_verdicts for part in (direct, factoids) if part is not None)
        return Detection(
            detector=self.name, score=score, threshold=self.threshold, flagged=score >= self.threshold,
            factoids=_implicated(score, judged, grounded.factoids, spotted.factoids if spotted else []),
            cost=Cost.of(stages, time.perf_counter() - started),
            stats=DetectionStats(factoids=len(judged), unparseable_verdicts=unparseable),
            features=values,
            settings={"contributions": weights.contributions(values, record),
                      "direct": direct.score if direct else None, "record": record, "quoted": quoted,
                      "short_context": short,  # which calibration read it (Weights.short_calibration)
                      # the cascade's first verdict, without `direct` (None: no cascade, a record or a quote)
                      "first_stage": first_stage,
                      # each step that moved the score, with its value before and after
                      "explanation": explanation,
                      "unsupported_words": grounded.settings.get("unsupported_words", [])},
        )


async def _all_at_once(parts: Mapping[str, Awaitable[Detection]]) -> dict[str, Detection]:
    """What each part found; if one fails, the others' calls are not waited for."""
    found = await together(parts.values())
    return dict(zip(parts, found, strict=True))


def _said(asked: Mapping[str, Detection]) -> dict[str, float]:
    """What the judge parts that were asked said, by their `JUDGE_FEATURES` names."""
    said = {name: part.score for name, part in asked.items() if name != "factoids"}
    if "factoids" in asked:
        said["factoid_max"] = max((f.score for f in asked["factoids"].factoids), default=0.0)
    return said


def _implicated(probability: float, judged: list[Factoid], ungrounded: list[Factoid],
                spotted: Sequence[Factoid] = ()) -> list[Factoid]:
    """The parts of the answer to point at, scored on the answer's own scale: what the judge named gets the
    answer's probability, an ungrounded sentence a share of it by how much of its content is unsupported,
    so that at the threshold a flagged answer highlights the judge's findings and its worst sentences. The
    sentence the spot check read gets the probability times the judge's P(NO) for it (`eval --rescore`
    scores it the same way from the spot check's own outcome)."""
    worst = max((f.score for f in ungrounded), default=0.0)
    top = max((f.score for f in judged), default=0.0)
    # each share taken first: the top span then gets the probability itself, never a rounding above it
    return ([f.model_copy(update={"score": probability * (f.score / top if top else 1.0)}) for f in judged]
            + [f.model_copy(update={"score": probability * (f.score / worst)}) for f in ungrounded if worst]
            + [f.model_copy(update={"score": probability * f.score}) for f in spotted if f.score > 0])


def _fingerprint(settings: CombinedSettings) -> dict[str, Any]:
    weights = load_weights(settings.weights, settings.profile)
    tuning, band = tuned(settings, weights), cascade_band(settings, weights)
    return {"options": settings.model_dump(exclude={"weights", "profile", "cascade", "cascade_weights",
                                                    "short_context"}),
            "weights": weights.model_dump(exclude={"fitted_on", "tuning"}),
            # what a short context is: it decides which calibration reads the answer and whether the cascade holds
            # `direct` back (None: it decides neither)
            "short_context": tuning.short_context if band is not None or weights.short_calibration else None,
            **({"cascade": {"band": list(band),
                            "weights": load_weights(settings.cascade_weights, "fast").model_dump(
                                exclude={"fitted_on", "tuning"})}} if band is not None else {}),
            "factoids": asdict(PROFILES["factoids"]), "spotcheck": SpotCheckSettings().model_dump(exclude={"model"}),
            "logprob_reader": 2, "grounding": GROUNDING_VERSION, **rules_fingerprint(),
            "alignment": ALIGNMENT_VERSION, "spotcheck_plan": SPOTCHECK_PLAN,
            "floors": tuning.model_dump(include={"instruction_floor", "changed_copy"}),
            "quoted_answers": "undoubted"}  # an answer quoting its context is not judged (`undoubted`)


register(DetectorSpec(
    name="combined", settings=CombinedSettings, profiles=tuple(p for p in WEIGHT_FILES if p),
    models=lambda settings: [settings.model],
    prompts=lambda settings: ["direct_system", "direct_user", "restatement_system", "restatement_user",
                              "spotcheck_system", "spotcheck_user",
                              "decompose_system", "decompose_user", "verify_system", "verify_user"],
    fingerprint=_fingerprint,
    fitted_judge=lambda settings: load_weights(settings.weights, settings.profile).fitted_on.get("judge"),
    build=lambda settings, threshold, llm: Combined(llm, settings, threshold)))
