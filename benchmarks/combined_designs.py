"""Which design of the combined check ranks best, by grouped cross-validation on the fit halves only.

Reads the judge parts' stored outcomes of finished fit-half runs (nothing calls the judge):

    morphguard eval -d ragtruth-qa,contrast-qa --half fit --detector direct,restatement,spotcheck
    morphguard eval -d ragtruth-summary --half fit --limit 100 --detector direct,restatement,spotcheck
    morphguard eval -d contrast-short-qa --half fit --detector direct,restatement,spotcheck
    python benchmarks/combined_designs.py [--shuffles 3] [--judged ragtruth-qa,contrast-qa]

Every design reads answers about structured records (RAGTruth's Data2txt) without the judge, so all of the
Data2txt fit half is scored in the folds, and none of it needs a judge run.

Each design is fitted with `eval/fit.fit` on four fifths of the sources and scores the fifth it has not seen
(folds of whole RAGTruth sources, so both answers of a contrast pair and all six models' answers to one
source stay together), over several shuffles of the folds; the table gives the mean AUROC per judged set and
its spread over the shuffles. The RAGTruth fit answers no judge has read join the training folds and teach
the channels that need no judge; the short contrast pairs (`HELD_OUT`) are scored and never taught, as the
shipped weights never saw them. Then, for the policy thresholds, the shipped weights' precision and recall
at each τ on the judged fit-half answers (pooled, and recall per set). Between the two, the cascade's band
(`tuning.cascade` in detectors/combined.json): in the same folds the shipped design and the same design without
`direct` (the fast profile's) are fitted, and each band [low, high) on a grid is scored as the cascade reads it: the
fast probability outside the band, the whole check's inside; the grid includes the empty band, which never asks
`direct` over a long context. The band chosen is the one that skips `direct` for the largest mean share of the
judged sets' answers while no judged set's AUROC falls more than 0.005 below the whole check's. The thresholds are
those of the shipped cascade. No fit-half context here is short enough for the cascade to ask `direct` at once
(`tuning.short_context`; the script stops if one is), so the band alone decides. Writes
benchmarks/results/combined_designs.json.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from pathlib import Path

from morphguard.config import Config
from morphguard.detectors import fingerprint
from morphguard.detectors.combined import (
    CHANNELS,
    JUDGE_FEATURES,
    TUNING,
    Weights,
    asks_direct,
    load_weights,
    short_context,
)
from morphguard.eval import datasets, fit, metrics, runner

HERE = Path(__file__).resolve().parent
SHIPPED_BAND = TUNING.cascade  # the shipped default's cascade band (detectors/combined.json, `tuning`)
if SHIPPED_BAND is None:
    raise SystemExit("the shipped combined.json holds no cascade band")
JUDGED = ("ragtruth-qa", "contrast-qa", "ragtruth-summary")  # those with a fit-half judge run
# Scored in every fold and taught in none, as the shipped weights never saw it: contrast-qa's pairs cut to the
# sentence each edit changed, the form of the hidden short contradiction cases. Its pairs share their sources
# with contrast-qa's, so they fall in the same folds, and a fold never scores an answer whose long twin it learnt.
HELD_OUT = ("contrast-short-qa",)
RECORDS = ("ragtruth-data2txt",)  # answers about records: scored without the judge by every design here
PARTS = ("direct", "restatement", "spotcheck")
FOUR_CHANNELS = {name: features for name, features in CHANNELS.items() if name != "spotted"}
DESIGNS = {  # name: channels
    "four channels: invented, contradicted, judged, misread": FOUR_CHANNELS,
    "no judge at all: vocabulary, negated copies, record fields": {
        "invented": CHANNELS["invented"], "contradicted": ("negation_conflict",), "misread": CHANNELS["misread"]},
    "the spot check in the judged channel, beside the whole-answer verdict": {
        **FOUR_CHANNELS, "judged": ("direct", "spotcheck")},
    "the spot check in place of the whole-answer verdict (one call fewer)": {**FOUR_CHANNELS, "judged": ("spotcheck",)},
    "the spot check a channel of its own (spotted)": {
        **CHANNELS, "contradicted": ("restatement", "negation_conflict")},
    "shipped: and a number put in another's place in a copy (number_conflict)": CHANNELS,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shuffles", type=int, default=3)
    parser.add_argument("--runs", type=Path, default=Path("runs/eval"))
    parser.add_argument("--judged", default=",".join(JUDGED + HELD_OUT),
                        help="the fit-half judge runs to read (comma-separated)")
    args = parser.parse_args()
    judged_sets = args.judged.split(",") + list(RECORDS)
    # A run folder also keeps the outcomes of parts run under other settings (a two-sentence spot check, say):
    # only those under the defaults, which `eval --fit` reads, count here.
    current = {part: fingerprint(Config(), part) for part in PARTS}
    rows: list[tuple[dict[str, float], bool, str, str]] = []  # features, label, group, dataset
    extra = []  # answers no judge has read: they teach the channels that need none
    row_of: dict[str, int] = {}  # item id -> its row, for the judged sets
    for dataset in JUDGED + HELD_OUT + RECORDS:
        if dataset in HELD_OUT and dataset not in judged_sets:
            continue
        items = datasets.load_half(dataset, "fit")
        if any(short_context(item.passages, TUNING.short_context) for item in items):
            raise SystemExit(f"{dataset} has contexts short enough for the cascade to ask direct at once, which the "
                             "bands below do not model (`tuning.short_context` in detectors/combined.json)")
        judged: set[str] = set()
        if dataset in RECORDS:
            values, labels, groups, _ = fit.rows(items, [], parts=())
            rows += [(v, y, g, dataset) for v, y, g in zip(values, labels, groups, strict=True)]
            continue
        if dataset in judged_sets:
            folder = max(args.runs.glob(f"{dataset}-fit-n*"), default=None,  # the largest sample
                         key=lambda f: int(f.name.removeprefix(f"{dataset}-fit-n").split("-")[0]))
            if folder is None:
                raise SystemExit(f"no fit-half run of {dataset} in {args.runs}: run the evals in the docstring first")
            if changed := runner.rebuilt(folder, items):
                raise SystemExit(f"{len(changed)} items of {folder} say something else than when it ran: run its eval "
                                 "in the docstring again first")
            outcomes = [o for o in runner.load_outcomes(folder) if o.fingerprint == current.get(o.detector)]
            for item in items:  # one at a time, to know the rows of a contrast pair's two answers
                values, labels, groups, _ = fit.rows([item], outcomes, PARTS)
                if values:
                    row_of[item.id] = len(rows)
                    rows.append((values[0], labels[0], groups[0], dataset))
                    judged.add(groups[0])
        if not dataset.startswith("contrast"):
            unread = [item for item in items if (item.group or item.id) not in judged]
            values, labels, groups, _ = fit.rows(unread, [], parts=())
            extra += [(v, y, g, dataset) for v, y, g in zip(values, labels, groups, strict=True)]

    sources = sorted({g for _, _, g, _ in rows} | {g for _, _, g, _ in extra})
    results: dict[str, dict[str, list[float]]] = {name: {d: [] for d in judged_sets} for name in DESIGNS}
    for shuffle in range(args.shuffles):
        order = sources[:]
        random.Random(shuffle).shuffle(order)
        fold = {g: n % 5 for n, g in enumerate(order)}
        for name, channels in DESIGNS.items():
            scores: dict[int, float] = {}
            for k in range(5):
                train = [r for r in rows + extra if fold[r[2]] != k and r[3] not in HELD_OUT]
                weights = fit.fit([r[0] for r in train], [r[1] for r in train], [r[2] for r in train], {},
                                  [r[3] for r in train], channels=channels)
                scores |= {n: weights.probability(r[0], weights.reads_record(r[0]))
                           for n, r in enumerate(rows) if fold[r[2]] == k}
            for dataset in judged_sets:
                mine = [n for n, r in enumerate(rows) if r[3] == dataset]
                results[name][dataset].append(metrics.auroc([rows[n][1] for n in mine], [scores[n] for n in mine]))

    table = {name: {d: {"mean": statistics.fmean(v), "sd": statistics.pstdev(v)} for d, v in by.items()}
             for name, by in results.items()}
    counts = {d: [sum(1 for r in rows if r[3] == d), sum(1 for r in rows if r[3] == d and r[1])] for d in judged_sets}
    print(f"grouped 5-fold CV on the fit halves, {args.shuffles} shuffles; AUROC mean ± sd")
    print(f"{'design':72s} " + "  ".join(f"{d} (n {n}, {h} halluc.)".ljust(22) for d, (n, h) in counts.items()))
    for name, by in table.items():
        print(f"{name:72s} " + "  ".join(f"{by[d]['mean']:.3f} ± {by[d]['sd']:.3f}".ljust(22) for d in judged_sets))
    twin = {i: i.removesuffix("/edited") + "/faithful" for i in row_of if i.endswith("/edited")}  # a contrast pair
    pairs = {d: [(row_of[e], row_of[f]) for e, f in twin.items() if rows[row_of[e]][3] == d and f in row_of]
             for d in judged_sets if d.startswith("contrast")}
    bands = _cascade_bands(rows, extra, sources, args.shuffles, judged_sets, pairs)
    thresholds = _thresholds(rows, judged_sets)
    print(f"\nshipped weights and cascade {list(SHIPPED_BAND)} on the fit halves (in sample), by threshold:")
    for tau, at in thresholds.items():
        print(f"  τ {tau:<5} pooled P {at['precision']:.3f} R {at['recall']:.3f} F1 {at['f1']:.3f}   recall "
              + "  ".join(f"{d} {at['recall_' + d]:.2f}" for d in judged_sets))
    out = HERE / "results" / "combined_designs.json"
    out.write_text(json.dumps({"shuffles": args.shuffles, "counts": counts, "auroc": table, "cascade": bands,
                               "thresholds": thresholds}, indent=2) + "\n")
    print(f"wrote {out}")


def _thresholds(rows: list[tuple[dict[str, float], bool, str, str]], judged_sets: list[str]
                ) -> dict[float, dict[str, float]]:
    weights, first = load_weights(None), load_weights(None, "fast")
    scored = [(cascaded(weights, first, r[0], SHIPPED_BAND), r[1], r[3]) for r in rows]
    out = {}
    for tau in (0.15, 0.175, 0.2, 0.225, 0.25, 0.275, 0.3, 0.4, 0.5, 0.6):
        at = metrics.at_threshold([y for _, y, _ in scored], [p for p, _, _ in scored], tau).as_dict()
        for dataset in judged_sets:
            caught = [p >= tau for p, y, d in scored if y and d == dataset]
            at["recall_" + dataset] = sum(caught) / len(caught)
        out[tau] = at
    return out


Row = tuple[dict[str, float], bool, str, str]  # features, label, group, dataset


def without_direct(values: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in values.items() if k != "direct"}


def cascaded(whole: Weights, first: Weights, values: dict[str, float], band: tuple[float, float],
             at_once: bool = False) -> float:
    """The probability as the cascade gives it (detectors/combined.Combined.detect): an answer about a record is read
    by the whole check's weights without any judge; otherwise the first stage's, unless its probability lies in the
    band or the context is short (`at_once`: `tuning.short_context`). (Without the floors, which raise both alike.)"""
    if whole.reads_record(values) or not any(f in values for f in JUDGE_FEATURES):
        return whole.probability(values, whole.reads_record(values))
    early = first.probability(without_direct(values))
    return whole.probability(values, short=at_once) if at_once or asks_direct(early, band) else early


def _cascade_bands(rows: list[Row], extra: list[Row], sources: list[str], shuffles: int, judged_sets: list[str],
                   pairs: dict[str, list[tuple[int, int]]]) -> dict[str, object]:
    """Out-of-fold probabilities of the shipped design with and without `direct`; each band's AUROC per set, share
    of answers that skip `direct` and, on a contrast set, share of pairs (rows: edited, faithful) whose edited answer
    scores higher; the band the rule chooses (module docstring), and the one it would choose if no set's share of
    pairs could fall by more than 0.01 either."""
    sets = [d for d in judged_sets if d not in RECORDS]
    folds_of = []
    for shuffle in range(shuffles):
        order = sources[:]
        random.Random(shuffle).shuffle(order)
        folds_of.append({g: n % 5 for n, g in enumerate(order)})
    per_shuffle: list[dict[int, tuple[float, float]]] = []  # row -> (whole, first stage)
    for fold in folds_of:
        scores: dict[int, tuple[float, float]] = {}
        for k in range(5):
            train = [r for r in rows + extra if fold[r[2]] != k and r[3] not in HELD_OUT]
            fitted = [fit.fit([f(r[0]) for r in train], [r[1] for r in train], [r[2] for r in train], {},
                              [r[3] for r in train]) for f in (dict, without_direct)]
            scores |= {n: (fitted[0].probability(r[0], fitted[0].reads_record(r[0])),
                           fitted[1].probability(without_direct(r[0])))
                       for n, r in enumerate(rows) if fold[r[2]] == k and r[3] in sets}
        per_shuffle.append(scores)

    def score(band: tuple[float, float]) -> dict[str, tuple[float, float, float | None]]:
        """Per set: AUROC, share skipping direct, share of pairs ranked right (None where no pairs)."""
        out = {}
        for dataset in sets:
            mine = [n for n, r in enumerate(rows) if r[3] == dataset]
            aurocs, skipped, ranked = [], [], []
            for scores in per_shuffle:
                read = {n: scores[n][0] if asks_direct(scores[n][1], band) else scores[n][1] for n in mine}
                auroc = metrics.auroc([rows[n][1] for n in mine], [read[n] for n in mine])
                assert auroc is not None  # every judged set has both kinds of answer
                aurocs.append(auroc)
                skipped.append(sum(not asks_direct(scores[n][1], band) for n in mine) / len(mine))
                ranked += [1.0 if read[e] > read[f] else 0.5 if read[e] == read[f] else 0.0
                           for e, f in pairs.get(dataset, [])]
            out[dataset] = (statistics.fmean(aurocs), statistics.fmean(skipped),
                            statistics.fmean(ranked) if ranked else None)
        return out

    whole = score((0.0, 1.01))
    # (0.0, 0.0) is the empty band: `direct` never asked over a long context, the first stage's weights alone
    grid = [(0.0, 0.0)] + [(round(0.05 + 0.025 * i, 3), round(0.3 + 0.05 * j, 2)) for i in range(9) for j in range(7)]
    rows_out, chosen, keeping_pairs = [], None, None
    print(f"\ncascade bands, grouped 5-fold CV, {shuffles} shuffles: AUROC (share skipping direct) [share of pairs "
          "ranked right]; whole check " + "  ".join(f"{d} {a:.3f}" + ("" if p is None else f" [{p:.3f}]")
                                                    for d, (a, _, p) in whole.items()))
    for band in grid:
        got = score(band)
        ok = all(got[d][0] >= whole[d][0] - 0.005 for d in sets)
        pairs_kept = ok and all((got[d][2] or 0.0) >= (whole[d][2] or 0.0) - 0.01 for d in pairs)
        skip = statistics.fmean(s for _, s, _ in got.values())
        rows_out.append({"band": band, "ok": ok, "pairs_kept": pairs_kept, "skip": skip, "sets": got})
        print(f"  [{band[0]}, {band[1]}) {'ok' if ok else '  '} mean skip {skip:.2f}  "
              + "  ".join(f"{d} {a:.3f} ({s:.2f})" + ("" if p is None else f" [{p:.3f}]")
                          for d, (a, s, p) in got.items()))
        if ok and (chosen is None or skip > chosen[1]):
            chosen = (band, skip)
        if pairs_kept and (keeping_pairs is None or skip > keeping_pairs[1]):
            keeping_pairs = (band, skip)
    print(f"chosen band: {chosen}; shipped: {list(SHIPPED_BAND)}; if no set's pairs may fall by more than 0.01 either: "
          f"{keeping_pairs}")
    return {"whole": whole, "grid": rows_out, "chosen": chosen, "keeping_pairs": keeping_pairs}


if __name__ == "__main__":
    main()
