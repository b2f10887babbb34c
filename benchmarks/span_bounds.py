"""Where `grounding` points, read against the gold spans between two bounds that need no judge.

Span F1 (character overlap, the RAGTruth protocol) mixes two things: which answers a check flags, and where in a
flagged answer it points. This benchmark holds the first fixed to read the second. With a perfect answer-level gate,
only the hallucinated answers are pointed at ("gated"); with none, every answer is ("ungated"). A check's span F1
comes near the first where it flags well and falls toward the second as it flags faithful answers, so a way of
pointing that gains at both bounds should gain for a check that reads it; the check's own runs are the proof. No
model; seconds. Prints a table and writes benchmarks/results/span_bounds.json.

    python benchmarks/span_bounds.py [--half fit] [--datasets ragtruth-qa,contrast-qa,...]

To compare with another version of grounding, run the same script with that version on the path, e.g. an older
checkout: `PYTHONPATH=/path/to/that/checkout python benchmarks/span_bounds.py --data-dir ../shared/data
--out old.json`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from morphguard.detectors.grounding import Grounding, GroundingSettings
from morphguard.eval import datasets, metrics
from morphguard.models import RagInput

HERE = Path(__file__).resolve().parent
SPANNED = ("ragtruth-qa", "ragtruth-summary", "ragtruth-data2txt", "contrast-qa", "contrast-summary",
           "contrast-short-qa", "contrast-brief-qa", "contrast-brief-summary")


def bounds(items: list[datasets.Item]) -> dict[str, float]:
    """Span F1 of grounding's spans with a perfect answer-level gate and with every answer pointed at."""
    grounding = Grounding(GroundingSettings())
    spanned = [i for i in items if i.spans is not None]
    gold = [[(s.start, s.end) for s in i.spans or []] for i in spanned]
    pointed = [[(f.start, f.end) for f in grounding.measure(RagInput(question=i.question, passages=i.passages),
                                                             i.answer).factoids if f.start is not None
                and f.end is not None] for i in spanned]
    gated = [spans if i.hallucinated else [] for spans, i in zip(pointed, spanned, strict=True)]
    return {"n": len(spanned), "hallucinated": sum(i.hallucinated for i in spanned),
            "gated": metrics.span_scores(gold, gated).f1, "ungated": metrics.span_scores(gold, pointed).f1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--half", default="fit")
    parser.add_argument("--datasets", default=",".join(SPANNED))
    parser.add_argument("--data-dir", type=Path, default=None, help="where the benchmark data is (../shared/data)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "span_bounds.json")
    args = parser.parse_args()
    results: dict[str, object] = {"half": args.half}
    print(f"grounding's span F1 ({args.half} halves): gated = only hallucinated answers pointed at, "
          "ungated = every answer")
    print(f"{'set':<24} {'n':>5} {'halluc.':>7} {'gated':>7} {'ungated':>8}")
    for name in args.datasets.split(","):
        row = bounds(datasets.load_half(name, args.half, args.data_dir))
        results[name] = row
        print(f"{name:<24} {row['n']:>5} {row['hallucinated']:>7} {row['gated']:>7.3f} {row['ungated']:>8.3f}")
    args.out.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
