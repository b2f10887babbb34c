"""How often `alignment.conflicts` finds a changed copy where there is none, and where there is one.

On labelled sets (RAGTruth, HaluEval) it counts the answers with a changed copy of each kind, faithful beside
hallucinated: in a faithful answer every one is a false alarm, and each costs a `restatement` call whose verdict
feeds the contradicted channel. On the contrast sets, where each edited answer has a faithful twin, it counts the
pairs whose edited answer holds more changed copies than its twin (the edit was seen), and the twins that hold one
already. No judge, no model; a few seconds. Prints a table per set and writes
benchmarks/results/conflict_precision.json.

    python benchmarks/conflict_precision.py [--half fit] [--datasets ragtruth-qa,contrast-summary,...]

To compare with another version of the rules, run the same script with that version on the path, e.g. an older
checkout: `PYTHONPATH=/path/to/that/checkout python benchmarks/conflict_precision.py --data-dir ../shared/data
--out old.json`.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from pathlib import Path

from morphguard.detectors.alignment import KINDS, conflicts
from morphguard.eval import datasets

HERE = Path(__file__).resolve().parent
LABELLED = ("ragtruth-qa", "ragtruth-summary", "halueval")
PAIRED = ("contrast-qa", "contrast-summary", "contrast-short-qa", "contrast-short-summary", "contrast-brief-qa",
          "contrast-brief-summary")


def labelled(items: list[datasets.Item]) -> dict[str, int]:
    """Answers, and answers with a changed copy of each kind (and of any), by label (`F` faithful, `H` not)."""
    counts: Counter[str] = Counter()
    for item in items:
        label = "H" if item.hallucinated else "F"
        kinds = {c.kind for c in conflicts(item.answer, list(item.passages))}
        counts[f"answers {label}"] += 1
        counts.update(f"{kind} {label}" for kind in kinds)
        if kinds:
            counts[f"any {label}"] += 1
    return dict(counts)


def paired(items: list[datasets.Item]) -> dict[str, dict[str, int]]:
    """Per kind of edit: pairs, pairs whose edited answer holds more changed copies than its twin, twins with one."""
    sides: dict[str, dict[str, int]] = defaultdict(dict)
    for item in items:
        pair, side = item.id.rsplit("/", 1)  # contrast/<source>/<kind>/<faithful|edited>
        sides[pair][side] = len(conflicts(item.answer, list(item.passages)))
    out: dict[str, dict[str, int]] = defaultdict(lambda: {"pairs": 0, "edit seen": 0, "twin has one": 0})
    for pair, found in sides.items():
        if len(found) < 2:
            continue
        row = out[pair.rsplit("/", 1)[1]]
        row["pairs"] += 1
        row["edit seen"] += found["edited"] > found["faithful"]
        row["twin has one"] += found["faithful"] > 0
    return dict(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--half", default="fit")
    parser.add_argument("--datasets", default=",".join(LABELLED + PAIRED))
    parser.add_argument("--data-dir", type=Path, default=None, help="where the benchmark data is (../shared/data)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "conflict_precision.json")
    args = parser.parse_args()
    results: dict[str, object] = {"half": args.half}
    for name in args.datasets.split(","):
        items = datasets.load_half(name, args.half, args.data_dir)
        if name in PAIRED:
            table = paired(items)
            results[name] = table
            print(f"\n{name} ({args.half} half): edit kind, pairs, edited answer holds more changed copies, "
                  "faithful twin holds one")
            for kind, row in sorted(table.items()):
                print(f"  {kind:<12} {row['pairs']:>5} {row['edit seen']:>6} {row['twin has one']:>6}")
        else:
            counts = labelled(items)
            results[name] = counts
            print(f"\n{name} ({args.half} half): answers with a changed copy, faithful / hallucinated "
                  f"(of {counts.get('answers F', 0)} / {counts.get('answers H', 0)})")
            for kind in (*KINDS, "any"):
                print(f"  {kind:<12} {counts.get(f'{kind} F', 0):>5} {counts.get(f'{kind} H', 0):>6}")
    args.out.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
