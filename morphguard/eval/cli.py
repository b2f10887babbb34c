"""`morphguard eval`: sample a dataset, run the detectors (resumably), write the report."""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from pathlib import Path

from tqdm import tqdm

from morphguard.config import Config
from morphguard.detectors import build_detector, resolve
from morphguard.errors import MorphguardError
from morphguard.eval import datasets, report, runner


def run_eval(args: argparse.Namespace, config: Config) -> int:
    names = [n.strip() for n in args.detector.split(",") if n.strip()]
    if not names:
        raise MorphguardError("--detector names no detector")
    for name in names:
        try:
            resolve(config, name)
        except ValueError as exc:
            raise MorphguardError(str(exc)) from None
    if args.limit is not None and args.limit < 1 or args.repeats < 1 or args.workers < 1:
        raise MorphguardError("--limit, --repeats and --workers must be at least 1")
    items = datasets.sample(datasets.load(args.dataset, args.data_dir), args.limit, args.seed)
    if not items:
        raise MorphguardError(f"dataset {args.dataset} has no items")
    folder = args.out or Path("runs") / "eval" / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', args.dataset)}-n{len(items)}-seed{args.seed}"
    runner.prepare_folder(folder, {"dataset": args.dataset, "limit": args.limit, "seed": args.seed,
                                   "items": [i.id for i in items]})
    # Repeats must reach the judge: without this every repeat would be served from the response cache.
    config = config.model_copy(update={"judge": config.judge.model_copy(
        update={"cache": config.judge.cache.model_copy(update={"enabled": False})})})
    detectors = {name: build_detector(config, name=name) for name in names}

    total = len(items) * len(names) * args.repeats
    with tqdm(total=total, desc="checks", unit="check", file=sys.stderr, mininterval=2, dynamic_ncols=True) as bar:
        bar.update(sum(1 for o in runner.load_outcomes(folder)
                       if o.error is None and o.detector in detectors and o.repeat < args.repeats))
        outcomes = asyncio.run(runner.run(items, detectors, folder, repeats=args.repeats, workers=args.workers,
                                          on_done=lambda o: bar.update(1)))
    summary = report.summarize(items, outcomes, names, calibrate=args.calibrate, seed=args.seed)
    written = report.write(folder, items, outcomes, summary)
    print(report.markdown(summary))
    print("\n".join(f"wrote {path}" for path in written), file=sys.stderr)
    return 0
