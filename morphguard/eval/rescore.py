"""`morphguard eval --rescore`: the combined check scored anew from a finished run, without the judge.

The combined check's outcome keeps its judge parts' scores among its features (`direct`, `restatement`,
`factoid_max`), and grounding costs nothing to recompute from the item. A new weights file (a refit, say on
reviewed production decisions) can therefore be read on a finished run exactly as a fresh run would read it
with the same judge replies: this writes those outcomes under the current fingerprint, so the report that
follows is the new weights'. Cost and time are the stored run's, since the same parts ran; an answer that the
check scores without the judge (one about a structured record, or one that quotes its context) costs what grounding
costs and keeps only grounding's spans; its stored judge features are stand-ins, so should the answer later be read
as one the check judges (a rule changed), it is left for a fresh run. Otherwise the stored spans keep their places,
rescaled to the new probability, and where grounding now points at a part of the answer no stored span covers (a
check added since, such as a record field stated against its value), that span joins them, scored as the combined
check scores grounding's spans.
A judge part the weights read but the stored outcome lacks (one added since, such as `spotcheck`) is read from
that part's own outcome of the same answer, with its spans, calls and time. So is a part run again since under
new settings (`restatement` after a change to the alignment it asks about): its new score replaces the stored
one, and those of its spans that no stored span covers join them. Its calls and time are already in the stored
run's, and stay as they were. Weights that leave out a part the stored outcome holds (the `fast` profile has no
`direct`) cannot be read this way where that part said anything: its spans and time are mixed into the stored
ones, so such an answer is left for a fresh run. A profile's own outcomes are read with its own weights
(`--rescore --detector combined:fast`). The default's cascade, which asks `direct` only for some answers, is
composed from the whole check's outcome and the fast profile's (`cascade`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from morphguard.detectors.combined import (
    JUDGE_FEATURES,
    Weights,
    asks_direct,
    fused,
    judged_values,
    read_text,
)
from morphguard.eval.items import Item
from morphguard.eval.runner import Outcome, ScoredSpan
from morphguard.models import RagInput

# Parts that can join the combined check after a run: read from their own stored outcome of the same answer
# (`eval --detector spotcheck` on the finished run), the same judge reply a fresh combined run would get.
OWN_OUTCOME = ("restatement", "spotcheck")


def unfinished(stored: Sequence[Outcome], detector: str, parts: Mapping[str, str]) -> dict[str, tuple[int, int]]:
    """The parts in `OWN_OUTCOME` whose run under the current settings (`parts`) covers some, but not all, of the
    answers that have a stored outcome of `detector` to rescore: {part: (answers covered, answers to rescore)}.
    A rescore then would read the new score where that run has reached and the stored one elsewhere, mixing two
    settings of one part in one report. (A part with no current outcome at all is read from the stored outcomes,
    as one whose settings have not changed.)"""
    wanted = {o.item_id for o in stored if o.detector == detector and o.error is None}
    out = {}
    for part, now in parts.items():
        covered = {o.item_id for o in stored if o.detector == part and o.error is None and o.fingerprint == now}
        if part in OWN_OUTCOME and covered and wanted - covered:
            out[part] = (len(wanted & covered), len(wanted))
    return out


def rescore(items: Sequence[Item], stored: Sequence[Outcome], weights: Weights, fingerprint: str,
            threshold: float, parts: Mapping[str, str] | None = None, detector: str = "combined",
            short_limit: int = 0) -> list[Outcome]:
    """New outcomes of `detector` (the combined check, or one of its profiles: `combined:fast`) for every stored one
    made under another fingerprint whose judge scores cover what `weights` needs; items that already have a
    current outcome are left alone. `parts`: the current fingerprint of each part in `OWN_OUTCOME`; only its
    outcomes under that fingerprint are read (none without). `short_limit`: the check's short-context limit
    (`combined.tuned`), which says whose context is short (`Weights.short_calibration`)."""
    by_id = {i.id: i for i in items}
    current = {o.key for o in stored if o.detector == detector and o.fingerprint == fingerprint}
    needed = [f for f in JUDGE_FEATURES if f in weights.features]
    current_parts = parts or {}
    own = {(o.item_id, o.repeat, o.detector): o for o in stored
           if o.detector in OWN_OUTCOME and o.error is None and o.fingerprint == current_parts.get(o.detector)}
    fresh: dict[tuple[str, int, str], Outcome] = {}
    for old in stored:
        item = by_id.get(old.item_id)
        if (old.detector != detector or old.error is not None or old.fingerprint == fingerprint or item is None
                or old.key in current):
            continue
        rerun = {p: own[(old.item_id, old.repeat, p)] for p in OWN_OUTCOME if (old.item_id, old.repeat, p) in own}
        joined = {p: part for p, part in rerun.items() if p not in old.features}  # new to it: cost and all
        judge = dict(old.features) | {p: part.score or 0.0 for p, part in rerun.items()}
        evidence = read_text(RagInput(question=item.question, passages=item.passages), item.answer, short_limit)
        measured = evidence.grounding
        record = evidence.about_record(weights)
        unjudged = not evidence.judged(weights)
        # a stored outcome that asked no judge (its answer read as a quote under the fingerprint it was made with)
        # holds stand-ins, not replies
        stand_in = old.llm_calls == 0 and any(f in old.features for f in JUDGE_FEATURES)
        if not unjudged and (stand_in or any(f not in judge for f in needed) or
                             any(old.features.get(f) and f not in needed for f in JUDGE_FEATURES)):
            continue
        # `direct` and the factoids' verdict as far as the weights read them; the parts an own outcome can add, as found
        said = {} if unjudged else {f: judge[f] for f in JUDGE_FEATURES
                                    if f in (needed if f in ("direct", "factoid_max") else judge)}
        values = judged_values(evidence, said, needed, record)
        score = fused(weights, evidence, values)
        # The spans were scored on the answer's probability (combined._implicated): rescaled to the new one.
        ratio = score / old.score if old.score else 0.0
        kept = [] if unjudged else old.factoid_spans
        spans = [ScoredSpan(start=s.start, end=s.end, score=s.score * ratio) for s in kept]
        new = [f for f in measured.factoids if f.start is not None and f.end is not None
               and not any(s.start < f.end and f.start < s.end for s in kept)]
        worst = max((f.score for f in measured.factoids), default=0.0)
        added = [ScoredSpan(start=f.start, end=f.end, score=score * (f.score / worst)) for f in new if worst]
        # A part read from its own outcome points where it pointed, scored as `combined` scores its spans.
        added += [] if unjudged else [ScoredSpan(start=s.start, end=s.end, score=score * s.score)
                                    for p, part in rerun.items() for s in part.factoid_spans if s.score > 0
                                    and (p in joined or not any(k.start < s.end and s.start < k.end for k in kept))]
        # An answer the weights score without the judge costs what grounding costs, as in a fresh run; one that a
        # part joined costs that part's calls and time too.
        cost = ({"llm_calls": 0, "input_tokens": 0, "output_tokens": 0, "seconds": measured.cost.seconds,
                 "stage_seconds": {}} if unjudged else
                {"llm_calls": old.llm_calls + sum(p.llm_calls for p in joined.values()),
                 "input_tokens": old.input_tokens + sum(p.input_tokens for p in joined.values()),
                 "output_tokens": old.output_tokens + sum(p.output_tokens for p in joined.values()),
                 "seconds": old.seconds + sum(p.seconds for p in joined.values()),
                 "stage_seconds": old.stage_seconds | {f"{name}.{stage}": t for name, p in joined.items()
                                                       for stage, t in p.stage_seconds.items()}})
        fresh[old.key] = old.model_copy(update={
            "score": score, "threshold": threshold, "flagged": score >= threshold, "features": values,
            "fingerprint": fingerprint, "factoid_spans": spans + added,
            "factoid_scores": ([] if unjudged else [f * ratio for f in old.factoid_scores]) + [s.score for s in added],
            **cost})
    return list(fresh.values())


def cascade(whole: Sequence[Outcome], first: Sequence[Outcome], band: tuple[float, float], fingerprint: str,
            threshold: float, detector: str = "combined", at_once: Collection[str] = ()) -> list[Outcome]:
    """The cascade's outcomes (`band`: `combined.cascade_band`) for every answer that has both a `whole` outcome (every
    part asked, the same weights) and a `first` one (the first stage's own: `combined:fast`, its weights and parts).
    Where the first stage's probability lies outside `band`, nothing more was asked, and its outcome is the cascade's,
    cost and spans included; inside, `direct` was asked too, and the whole outcome is the cascade's. So a finished run
    of both profiles reads as a fresh cascade would with the same judge replies (the embedded judge answers the parts
    one after the other either way, though in another order, which its prompt cache can move by a few hundredths).
    An answer about a structured record asks no judge part: the whole outcome's, as the cascade scores it with the
    default's weights. So is an answer in `at_once`: item ids whose context is short
    (`Tuning.short_context`), for which the cascade asked every part at once, or whose answer quotes its
    context (asked nothing). None of these has a first stage, so none needs the fast profile's outcome."""
    firsts = {(o.item_id, o.repeat): o for o in first if o.error is None}
    out = []
    for full in whole:
        if full.error is not None:
            continue
        about_record = not any(f in full.features for f in JUDGE_FEATURES)
        stage = firsts.get((full.item_id, full.repeat))
        if about_record or full.item_id in at_once:  # no first stage: the check never computes one
            chosen = full
        elif stage is None or stage.score is None:
            continue
        else:
            chosen = full if asks_direct(stage.score, band) else stage
        out.append(chosen.model_copy(update={"detector": detector, "fingerprint": fingerprint, "threshold": threshold,
                                             "flagged": (chosen.score or 0.0) >= threshold}))
    return out
