"""What each detector (or MetaRAG profile) costs per response, read beside its quality on the same sample.

Runs through the resumable evaluation runner (results are kept in the run folder, so a second call only
reports), with the judge of the config (default: the embedded local model). Prints one table and writes
benchmarks/results/detector_cost.json.

    python benchmarks/detector_cost.py [--dataset ragtruth-qa] [--limit 24] [--seed 0]
                                       [--detector metarag:embedded,metarag:paper,direct,length]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from morphguard.config import load_config
from morphguard.eval import runner
from morphguard.eval.cli import evaluate, fingerprint

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="ragtruth-qa")
    parser.add_argument("--limit", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--detector", default="metarag:embedded,metarag:paper,direct,length")
    parser.add_argument("--config", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None, help="run folder (default: shared with `morphguard eval`)")
    args = parser.parse_args()
    names = [n.strip() for n in args.detector.split(",") if n.strip()]
    config = load_config(args.config)
    run = evaluate(config, args.dataset, names, limit=args.limit, seed=args.seed, out=args.out)
    summary, folder = run.summary, run.folder
    outcomes = [o for o in runner.load_outcomes(folder) if o.error is None and o.repeat == 0]

    rows = []
    for name in names:
        current = fingerprint(config, name)  # the folder may also hold results under earlier settings
        mine = [o for o in outcomes if o.detector == name and o.fingerprint == current]
        stages = sorted({s for o in mine for s in o.stage_seconds})
        d = summary["detectors"][name]
        rows.append({
            "detector": name, "responses": len(mine),
            "llm_calls": statistics.fmean(o.llm_calls for o in mine),
            "input_tokens": statistics.fmean(o.input_tokens for o in mine),
            "output_tokens": statistics.fmean(o.output_tokens for o in mine),
            "seconds_median": statistics.median(o.seconds for o in mine),
            "seconds_p90": (statistics.quantiles([o.seconds for o in mine], n=10)[-1] if len(mine) > 1
                            else mine[0].seconds),
            "stage_seconds_median": {s: statistics.median(o.stage_seconds.get(s, 0.0) for o in mine) for s in stages},
            "f1": d["f1"]["mean"], "auroc": d["auroc"]["mean"], "pr_auc": d["pr_auc"]["mean"],
        })
    slowest = max(rows, key=lambda r: r["seconds_median"])
    header = (f"{'detector':<18} {'n':>3} {'calls':>6} {'in tok':>7} {'out tok':>7} {'s med':>6} {'s p90':>6} "
              f"{'× time':>6} {'F1':>6} {'AUROC':>6} {'PR-AUC':>6}  stages (median s)")
    lines = [f"detector cost on {args.dataset}, {summary['items']} items (seed {args.seed}), "
             f"judge {config.judge.model}, {os.cpu_count()} cores; × time against {slowest['detector']}",
             header, "-" * len(header)]
    fmt = lambda v: "–" if v is None else f"{v:.3f}"  # noqa: E731
    for r in rows:
        stages = " ".join(f"{k} {v:.1f}" for k, v in r["stage_seconds_median"].items())
        ratio = r["seconds_median"] / slowest["seconds_median"] if slowest["seconds_median"] else 0.0
        lines.append(f"{r['detector']:<18} {r['responses']:>3} {r['llm_calls']:>6.1f} {r['input_tokens']:>7.0f} "
                     f"{r['output_tokens']:>7.0f} {r['seconds_median']:>6.1f} {r['seconds_p90']:>6.1f} {ratio:>6.2f} "
                     f"{fmt(r['f1']):>6} {fmt(r['auroc']):>6} {fmt(r['pr_auc']):>6}  {stages}")
    print("\n".join(lines))
    out = HERE / "results" / "detector_cost.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"dataset": args.dataset, "limit": args.limit, "seed": args.seed,
                               "judge": config.judge.model, "run_folder": str(folder), "rows": rows}, indent=2))
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
