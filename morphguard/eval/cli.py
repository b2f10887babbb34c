"""`morphguard eval`: sample a dataset, run the detectors (resumably), write the report."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from morphguard.config import Config
from morphguard.detectors import build_detector, resolve
from morphguard.detectors.metarag import resolve_options
from morphguard.errors import MorphguardError
from morphguard.eval import datasets, report, runner


def run_eval(args: argparse.Namespace, config: Config) -> int:
    names = [n.strip() for n in args.detector.split(",") if n.strip()]
    summary, folder, written = evaluate(config, args.dataset, names, limit=args.limit, seed=args.seed,
                                        repeats=args.repeats, workers=args.workers, calibrate=args.calibrate,
                                        data_dir=args.data_dir, out=args.out)
    print(report.markdown(summary))
    print("\n".join(f"wrote {path}" for path in written), file=sys.stderr)
    return 0


def evaluate(config: Config, dataset: str, names: Sequence[str], *, limit: int | None = None, seed: int = 0,
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
    items = datasets.sample(datasets.load(dataset, data_dir), limit, seed)
    if not items:
        raise MorphguardError(f"dataset {dataset} has no items")
    folder = out or Path("runs") / "eval" / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', dataset)}-n{len(items)}-seed{seed}"
    runner.prepare_folder(folder, {"dataset": dataset, "limit": limit, "seed": seed, "items": [i.id for i in items]})
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
    summary.update(dataset=dataset, limit=limit, seed=seed)
    return summary, folder, report.write(folder, items, outcomes, summary)


def fingerprint(config: Config, name: str) -> str:
    """A short hash of everything that decides a detector's output: judge, threshold, MetaRAG options, prompts."""
    from morphguard.detectors.prompts import template

    base, resolved = resolve(config, name)
    parts: dict[str, Any] = {"detector": base, "threshold": resolved.detector.threshold}
    if base != "length":
        parts["judge"] = [resolved.judge.model, resolved.judge.api_base]
        if config.judge.model == "local":
            parts["local"] = resolved.local.sha256
        names = {"metarag": ["decompose_system", "decompose_user", "synonym_system", "antonym_system", "mutate_user",
                             "verify_system", "verify_user"], "direct": ["direct_system", "direct_user"],
                 "claims": ["claims_system", "direct_user", "claims_extract_system", "decompose_user",
                            "claims_label_system", "claims_label_user"],
                 "hierarchical": ["hier_decompose_system", "hier_decompose_user", "hier_verify_system",
                                  "hier_verify_user"]}[base]
        parts["prompts"] = {n: template(n) for n in names}
    if base == "metarag":
        options = dataclasses.asdict(resolve_options(resolved.metarag))
        # The cache never changes a verdict, and a fast-check switch left off is the behaviour from before
        # it existed: neither makes earlier results stale.
        options.pop("verdict_cache")
        for switch, off in (("batch_mutations", False), ("batch_verify", "none"), ("rule_antonyms", False),
                            ("decompose", "llm"), ("context_budget", 0)):
            if options[switch] == off:
                options.pop(switch)
        parts["options"] = options
        for switch, prompts in (("batch_mutations", ["mutate_batch_system", "mutate_batch_user"]),
                                ("batch_verify", ["verify_batch_system", "verify_batch_user"])):
            if switch in options:  # on
                parts["prompts"].update({n: template(n) for n in prompts})
    elif base in ("claims", "hierarchical"):
        parts["options"] = getattr(resolved, base).model_dump()
    if base in ("direct", "hierarchical") or parts.get("options", {}).get("soft_verdicts"):
        # Scores read from log-probabilities; version 2 finds the verdict token in the generated tokens, not the
        # reply text (which can lack a ```json fence the tokens have), so results scored before are stale.
        parts["logprob_reader"] = 2
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]
