"""How often the edited answer of a contrast pair outscores its faithful twin, by kind of edit, with and without
the cascade: the shipped weights asking every part, the cascade (`tuning.cascade` in detectors/combined.json, and
every part at once over a context of at most `tuning.short_context` characters, as in `contrast-brief`), the fast
profile.

AUROC compares every answer with every other; a pair compares an answer with its own minimal edit, which is
what the hidden contradiction cases test. Reads the judge parts' stored outcomes of a finished run (nothing
calls the judge):

    morphguard eval -d contrast-short-qa --half fit --detector direct,restatement,spotcheck
    python benchmarks/contrast_pairs.py [--dataset contrast-short-qa] [--half fit]

A tie counts half. In sample on the fit half: the shipped weights were fitted there (never on the short pairs).
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

from combined_designs import PARTS, SHIPPED_BAND, cascaded, without_direct

from morphguard.config import Config
from morphguard.detectors import fingerprint
from morphguard.detectors.combined import TUNING, load_weights, short_context
from morphguard.eval import datasets, fit, runner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="contrast-short-qa")
    parser.add_argument("--half", default="fit")
    parser.add_argument("--runs", type=Path, default=Path("runs/eval"))
    args = parser.parse_args()
    folder = max(args.runs.glob(f"{args.dataset}-{args.half}-n*"), default=None,  # the largest sample
                 key=lambda f: int(f.name.removeprefix(f"{args.dataset}-{args.half}-n").split("-")[0]))
    if folder is None:
        raise SystemExit(f"no {args.half}-half run of {args.dataset} in {args.runs}: run the eval in the docstring")
    items = datasets.load_half(args.dataset, args.half)
    if changed := runner.rebuilt(folder, items):
        raise SystemExit(f"{len(changed)} items of {folder} say something else than when it ran: run its eval again")
    current = {part: fingerprint(Config(), part) for part in PARTS}
    outcomes = [o for o in runner.load_outcomes(folder) if o.fingerprint == current.get(o.detector)]
    whole, first = load_weights(None), load_weights(None, "fast")
    readings = {"every part asked": lambda v, short: whole.probability(v, short=short),
                f"cascade {list(SHIPPED_BAND)}": lambda v, short: cascaded(whole, first, v, SHIPPED_BAND,
                                                                          at_once=short),
                "combined:fast": lambda v, short: first.probability(without_direct(v), short=short)}
    scores: dict[str, dict[str, float]] = defaultdict(dict)
    for item in items:
        values, _, _, _ = fit.rows([item], outcomes, PARTS)
        short = short_context(item.passages, TUNING.short_context)
        for name, read in readings.items():
            scores[name] |= {item.id: read(values[0], short)} if values else {}
    kinds: dict[str, list[str]] = defaultdict(list)  # kind -> edited ids whose twin was scored too
    for item_id in scores["every part asked"]:
        twin = item_id.removesuffix("/edited") + "/faithful"
        if item_id.endswith("/edited") and twin in scores["every part asked"]:
            kinds[item_id.split("/")[2]].append(item_id)
    if not kinds:
        raise SystemExit(f"no pair in {folder} has an outcome of every part ({', '.join(PARTS)}) for both answers")
    print(f"{args.dataset}, {args.half} half ({folder.name}): share of pairs whose edited answer scores higher")
    print(f"{'kind':12s} {'pairs':>5s}  " + "  ".join(f"{name:>24s}" for name in readings))
    for kind, edited in sorted(kinds.items()) + [("all", [i for ids in kinds.values() for i in ids])]:
        shares = []
        for name in readings:
            s = scores[name]
            won = [1.0 if s[i] > s[t] else 0.5 if s[i] == s[t] else 0.0
                   for i, t in ((i, i.removesuffix("/edited") + "/faithful") for i in edited)]
            shares.append(sum(won) / len(won))
        print(f"{kind:12s} {len(edited):5d}  " + "  ".join(f"{share:24.3f}" for share in shares))


if __name__ == "__main__":
    main()
