"""`morphguard eval`: sample a dataset, run the detectors (resumably), write the report."""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from morphguard.config import Config
from morphguard.detectors import build_detector, fingerprint, resolve
from morphguard.errors import MorphguardError
from morphguard.eval import datasets, report, runner


def run_eval(args: argparse.Namespace, config: Config) -> int:
    names = [n.strip() for n in args.detector.split(",") if n.strip()]
    summary, folder, written = evaluate(config, args.dataset, names, half=args.half, limit=args.limit, seed=args.seed,
                                        repeats=args.repeats, workers=args.workers, calibrate=args.calibrate,
                                        data_dir=args.data_dir, out=args.out)
    print(report.markdown(summary))
    print("\n".join(f"wrote {path}" for path in written), file=sys.stderr)
    return 0


def evaluate(config: Config, dataset: str, names: Sequence[str], *, half: str | None = None,
             limit: int | None = None, seed: int = 0,
             repeats: int = 1, workers: int = 1, calibrate: bool = False, data_dir: Path | None = None,
             out: Path | None = None) -> tuple[dict[str, Any], Path, list[Path]]:
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
    items = [i for i in datasets.load(dataset, data_dir) if half is None or datasets.half_of(i) == half]
    items = datasets.sample(items, limit, seed)
    if not items:
        raise MorphguardError(f"dataset {dataset} has no items")
    label = re.sub(r"[^A-Za-z0-9_.-]+", "_", dataset) + (f"-{half}" if half else "")
    folder = out or Path("runs") / "eval" / f"{label}-n{len(items)}-seed{seed}"
    runner.prepare_folder(folder, {"dataset": dataset, "half": half, "limit": limit, "seed": seed,
                                   "items": [i.id for i in items]})
    # Repeats must reach the judge: without this every repeat would be served from the response cache.
    config = config.model_copy(update={"judge": config.judge.model_copy(
        update={"cache": config.judge.cache.model_copy(update={"enabled": False})})})
    detectors = {name: build_detector(config, name=name) for name in names}
    fingerprints = {name: fingerprint(config, name) for name in names}

    total = len(items) * len(names) * repeats
    with tqdm(total=total, desc="checks", unit="check", file=sys.stderr, mininterval=2, dynamic_ncols=True) as bar:
        bar.update(len({o.key for o in runner.load_outcomes(folder) if o.error is None and o.repeat < repeats
                        and o.fingerprint == fingerprints.get(o.detector)}))
        outcomes = asyncio.run(runner.run(items, detectors, folder, repeats=repeats, workers=workers,
                                          fingerprints=fingerprints, on_done=lambda o: bar.update(1)))
    summary = report.summarize(items, outcomes, list(names), calibrate=calibrate, seed=seed)
    summary.update(dataset=dataset, half=half or "all", limit=limit, seed=seed)
    return summary, folder, report.write(folder, items, outcomes, summary)
