"""`morphguard eval`: sample a dataset, run the detectors (resumably), write the report."""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from morphguard.config import Config
from morphguard.detectors import build_detector, configured, fingerprint, resolve
from morphguard.detectors.combined import (
    PARTS,
    SHIPPED_PARTS,
    Weights,
    cascade_band,
    load_weights,
    read_text,
    tuned,
)
from morphguard.detectors.judges import judge_identity
from morphguard.errors import MorphguardError
from morphguard.eval import datasets, fit, report, rescore, runner, thresholds
from morphguard.eval.items import Item
from morphguard.models import RagInput

# The checks that need no judge, measured beside the one under test: a check worth its judge calls beats both.
BASELINES = ("grounding", "length")


@dataclass
class Evaluation:
    summary: dict[str, Any]
    folder: Path
    written: list[Path]
    items: list[Item]
    outcomes: list[runner.Outcome]


def default_detectors(config: Config) -> list[str]:
    """What `eval` measures unless told: the check the proxy runs with this config (`detector.name`, `auto`
    resolved for the configured judge) and the baselines beside it."""
    return list(dict.fromkeys([configured(config), *BASELINES]))


def run_eval(args: argparse.Namespace, config: Config) -> int:
    if args.detector:
        names = [n.strip() for n in args.detector.split(",") if n.strip()]
    elif args.fit:
        names = list(SHIPPED_PARTS)
    else:
        names = default_detectors(config)
        print(f"measuring {names[0]}, the check detector.name: {config.detector.name} runs with the judge "
              f"{config.judge.model}, beside the baselines {' and '.join(BASELINES)} (--detector chooses)",
              file=sys.stderr)
    if args.fit_without_judge and not args.fit:
        raise MorphguardError("--fit-without-judge adds datasets to --fit: give --fit too")
    if args.recalibrate and not args.fit:
        raise MorphguardError("--recalibrate says how --fit fits: give --fit too")
    if args.recalibrate and args.fit_without_judge:
        raise MorphguardError("--fit-without-judge teaches channels, which --recalibrate keeps as they are")
    if args.fit and not set(PARTS).intersection(names):
        raise MorphguardError(f"--fit needs one or more of the combined check's judge parts among the detectors: "
                              f"{', '.join(PARTS)}")
    chosen = [d.strip() for d in args.dataset.split(",") if d.strip()]
    if args.out and len(chosen) > 1:
        raise MorphguardError("--out names one run folder: give one dataset")
    runs = []
    limits = _limits(args.limit, len(chosen))
    for dataset, limit in zip(chosen, limits, strict=True):  # each in its own run folder, with its own report
        run = evaluate(config, dataset, names, half=args.half, limit=limit, seed=args.seed,
                       repeats=args.repeats, workers=args.workers, calibrate=args.calibrate,
                       data_dir=args.data_dir, out=args.out, rescore=args.rescore)
        print(report.markdown(run.summary))
        print("\n".join(f"wrote {path}" for path in run.written), file=sys.stderr)
        runs.append(run)
    if args.target_recall is not None or args.target_precision is not None:
        _propose_thresholds(args, config, runs, names[0])
    if args.fit:
        _fit_weights(args, config, runs, names, chosen)
    return 0


def _propose_thresholds(args: argparse.Namespace, config: Config, runs: list[Evaluation], detector: str) -> None:
    target = (f"recall ≥ {args.target_recall}" if args.target_recall is not None
              else f"precision ≥ {args.target_precision}")
    proposals = thresholds.propose([i for run in runs for i in run.items], [o for run in runs for o in run.outcomes],
                                   detector, config.policy, recall=args.target_recall, precision=args.target_precision)
    print("\n" + thresholds.snippet(proposals, detector, target, config.policy.default_profile))


def _fit_weights(args: argparse.Namespace, config: Config, runs: list[Evaluation], names: list[str],
                 datasets_used: list[str]) -> None:
    parts = [p for p in PARTS if p in names]
    _, settings = resolve(config, "combined")
    configured_weights = load_weights(settings.weights, settings.profile)
    # the figures the configured check runs with, carried into the file written: the fit learns none of them
    tuning = tuned(settings, configured_weights)
    found = [(fit.rows(run.items, run.outcomes, parts, tuning.short_context), dataset)
             for run, dataset in zip(runs, datasets_used, strict=True)]
    unjudged = [d.strip() for d in (args.fit_without_judge or "").split(",") if d.strip()]
    sampled = {i.id for run in runs for i in run.items}  # a dataset both judged (a sample) and not: the rest of it
    for dataset in unjudged:
        rest = [i for i in datasets.load_half(dataset, args.half, args.data_dir, config) if i.id not in sampled]
        found.append((fit.rows(rest, [], (), tuning.short_context), dataset))
    values = [v for (rows, _) in found for v in rows[0]]
    labels = [y for (rows, _) in found for y in rows[1]]
    groups = [g for (rows, _) in found for g in rows[2]]
    short = [s for (rows, _) in found for s in rows[3]]
    sources = [dataset for (rows, dataset) in found for _ in rows[1]]
    about = {"judge": judge_identity(config, settings.model),
             "datasets": datasets_used, "without_judge": unjudged, "half": args.half or "all",
             "short_context": tuning.short_context,
             "grounding": fingerprint(config, "grounding"), "fingerprints": {n: fingerprint(config, n) for n in parts}}
    if args.recalibrate:
        weights = fit.recalibrate(configured_weights, values, labels, about, sources, short)
        done = weights.fitted_on["recalibrated"]
        said = (f"calibrations ({', '.join(done['calibrations'])}) fitted on {done['items']} items "
                f"({done['hallucinated']} hallucinated, {done['items_over_short_context']} over a short context), "
                "channels kept")
    else:
        weights = fit.fit(values, labels, groups, about, sources, short=short)
        fitted = weights.fitted_on
        said = (f"weights fitted on {fitted['items']} items ({fitted['hallucinated']} hallucinated)"
                + (f" and, for the channels without a judge, {fitted['items_without_judge']} more "
                   f"({fitted['hallucinated_without_judge']} hallucinated)" if unjudged else ""))
    band = tuning.cascade if "direct" in weights.features else None  # a band only where there is `direct` to hold back
    weights = weights.model_copy(update={"tuning": tuning.model_copy(update={"cascade": band})})
    args.fit.parent.mkdir(parents=True, exist_ok=True)
    args.fit.write_text(weights.model_dump_json(indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.fit}: {said}; use it with combined.weights in the config", file=sys.stderr)


def _rescore(config: Config, folder: Path, items: list[Item], name: str, current: str) -> None:
    _, settings = resolve(config, name)
    weights = load_weights(settings.weights, settings.profile)
    short_limit, band = tuned(settings, weights).short_context, cascade_band(settings, weights)
    stored = runner.load_outcomes(folder)
    parts = {part: fingerprint(config, part) for part in rescore.OWN_OUTCOME}
    threshold = config.detector.threshold
    if partial := rescore.unfinished(stored, name, parts):
        raise MorphguardError("--rescore: " + "; ".join(
            f"{part} has run under its current settings on {done} of the {total} answers to rescore"
            for part, (done, total) in partial.items()) + "; finish that run (eval --detector " + ",".join(partial)
            + ") first, or the report would mix its old and new scores")

    def scored(detector: str, under: Config, read_with: Weights) -> list[runner.Outcome]:
        """This run's outcomes of `detector` configured as in `under`: those stored current, and those rescored."""
        now, (_, own) = fingerprint(under, detector), resolve(under, detector)
        return ([o for o in stored if o.detector == detector and o.fingerprint == now]
                + rescore.rescore(items, stored, read_with, now, threshold, parts=parts, detector=detector,
                                  short_limit=tuned(own, read_with).short_context))

    if band is None:
        fresh = rescore.rescore(items, stored, weights, current, threshold, parts=parts, detector=name,
                                short_limit=short_limit)
    elif settings.cascade_weights is not None:
        raise MorphguardError("--rescore reads a cascade's first stage from combined:fast's outcomes; with "
                              "combined.cascade_weights set, run the check afresh")
    else:
        # The cascade from the whole check's outcomes (every part asked) and the fast profile's (its first stage).
        whole = scored(name, config.with_section("combined", settings.model_copy(update={"cascade": None})), weights)
        first = scored("combined:fast", config, load_weights(None, "fast"))
        done = {o.key for o in stored if o.detector == name and o.fingerprint == current}
        # the answers the cascade asks every part at once, or none: no first stage
        read = [read_text(RagInput(question=item.question, passages=item.passages), item.answer, short_limit)
                for item in items]
        at_once = {item.id for item, evidence in zip(items, read, strict=True) if evidence.short or evidence.quoted}
        fresh = [o for o in rescore.cascade(whole, first, band, current, threshold, detector=name,
                                            at_once=at_once) if o.key not in done]
    runner.append_outcomes(folder, fresh)
    print(f"rescored {len(fresh)} {name} outcomes from their stored judge scores", file=sys.stderr)


def _limits(given: str | None, count: int) -> list[int | None]:
    """`--limit`: one number for every dataset, or one per dataset (comma-separated; `all` for no limit)."""
    parts = [p.strip() for p in (given or "all").split(",")]
    if len(parts) not in (1, count):
        raise MorphguardError(f"--limit gives {len(parts)} limits for {count} datasets")
    try:
        limits = [None if p in ("", "all") else int(p) for p in parts]
    except ValueError:
        raise MorphguardError(f"--limit must be a number or 'all', not {given!r}") from None
    return limits * count if len(limits) == 1 else limits


def evaluate(config: Config, dataset: str, names: Sequence[str], *, half: str | None = None,
             limit: int | None = None, seed: int = 0,
             repeats: int = 1, workers: int = 1, calibrate: bool = False, data_dir: Path | None = None,
             out: Path | None = None, rescore: bool = False) -> Evaluation:
    """Run (or resume) an evaluation and write its report; returns the summary, the run folder and the files."""
    if not names:
        raise MorphguardError("--detector names no detector")
    for name in names:
        try:
            resolve(config, name)
        except ValueError as exc:
            raise MorphguardError(str(exc)) from None
    if limit is not None and limit < 1 or repeats < 1 or workers < 1:
        raise MorphguardError("--limit, --repeats and --workers must be at least 1")
    if half is not None and half not in datasets.HALVES:
        raise MorphguardError(f"--half must be one of {', '.join(datasets.HALVES)}")
    items = datasets.load_half(dataset, half, data_dir, config)
    items = datasets.sample(items, limit, seed)
    if not items:
        raise MorphguardError(f"dataset {dataset} has no items")
    label = re.sub(r"[^A-Za-z0-9_.-]+", "_", dataset) + (f"-{half}" if half else "")
    folder = out or Path("runs") / "eval" / f"{label}-n{len(items)}-seed{seed}"
    rebuilt = runner.prepare_folder(folder, {"dataset": dataset, "half": half, "seed": seed,
                                             "items": [i.id for i in items], "content": runner.content(items)})
    if rebuilt:
        print(f"{len(rebuilt)} items say something else than when {folder} last ran; their outcomes were dropped "
              "and they are checked again", file=sys.stderr)
    # Repeats must reach the judge: without this every repeat would be served from the response cache.
    config = config.model_copy(update={"judge": config.judge.model_copy(
        update={"cache": config.judge.cache.model_copy(update={"enabled": False})})})
    fingerprints = {name: fingerprint(config, name) for name in names}
    for name in names if rescore else ():
        if name.partition(":")[0] == "combined":  # the default's or a profile's (`combined:fast`)
            _rescore(config, folder, items, name, fingerprints[name])
    detectors = {name: build_detector(config, name=name) for name in names}

    total = len(items) * len(names) * repeats
    with tqdm(total=total, desc="checks", unit="check", file=sys.stderr, mininterval=2, dynamic_ncols=True) as bar:
        bar.update(len({o.key for o in runner.load_outcomes(folder) if o.error is None and o.repeat < repeats
                        and o.fingerprint == fingerprints.get(o.detector)}))
        outcomes = asyncio.run(runner.run(items, detectors, folder, repeats=repeats, workers=workers,
                                          fingerprints=fingerprints, on_done=lambda o: bar.update(1)))
    summary = report.summarize(items, outcomes, list(names), calibrate=calibrate, seed=seed,
                               threshold=config.detector.threshold)
    summary.update(dataset=dataset, half=half or "all", limit=limit, seed=seed)
    return Evaluation(summary, folder, report.write(folder, items, outcomes, summary), items, outcomes)
