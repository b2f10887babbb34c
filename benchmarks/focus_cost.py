"""What choosing the context for a `sentences` check's prompts costs on the largest check the proxy makes.

The answer and context of `benchmarks/isolation.py`'s large check (short sentences of common words against a context
of about a megabyte whose every sentence shares some of them): CPU seconds (`time.process_time`) of `Focus.select`
for `--claims` of the answer's sentences against contexts of growing size, with each claim scored against at most
`focus.CANDIDATES` sentences, beside the same selection with no bound (every sentence sharing a word with the claim),
measured in the same run. The exponent of each column's growth with the context's size is fitted (least squares of
log time on log size) and printed: 0 is flat, 1 linear (so the whole check grows with claims times context). No
judge, no model.

    python benchmarks/focus_cost.py [--claims 400] [--chars 125000,250000,500000,990000]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from isolation import largest  # noqa: E402

from morphguard.detectors import focus  # noqa: E402
from morphguard.detectors.text import sentences  # noqa: E402

HERE = Path(__file__).resolve().parent


def timed(passages: list[str], claims: list[str], bound: int) -> float:
    kept = focus.CANDIDATES
    focus.CANDIDATES = bound
    try:
        context = focus.Focus(passages)
        assert context.holding  # the index is read once per check; the selections are what is timed
        started = time.process_time()
        context.select(claims, 24_000)
        return time.process_time() - started
    finally:
        focus.CANDIDATES = kept


def exponent(xs: list[int], ys: list[float]) -> float:
    lx, ly = [math.log(x) for x in xs], [math.log(max(y, 1e-6)) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / sum((a - mx) ** 2 for a in lx)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claims", type=int, default=400)
    parser.add_argument("--chars", default="125000,250000,500000,990000")
    args = parser.parse_args()
    sizes = [int(n) for n in args.chars.split(",")]
    rows = []
    print(f"{'context chars':>14} {'bounded s':>10} {'every s':>9}")
    for chars in sizes:
        body = largest(args.claims, chars)
        answer, passages = str(body["answer"]), list(body["context"])  # type: ignore[call-overload]
        claims = [answer[s:e] for s, e in sentences(answer)]
        bounded, every = timed(passages, claims, focus.CANDIDATES), timed(passages, claims, 10 ** 9)
        size = sum(map(len, passages))
        rows.append({"context_chars": size, "claims": len(claims), "bounded_s": round(bounded, 3),
                     "every_s": round(every, 3)})
        print(f"{size:>14,} {bounded:>10.3f} {every:>9.3f}")
    xs = [r["context_chars"] for r in rows]
    fits = {"bounded": round(exponent(xs, [r["bounded_s"] for r in rows]), 2),
            "every": round(exponent(xs, [r["every_s"] for r in rows]), 2)}
    print(f"{args.claims} claims; fitted exponent in the context's size: bounded {fits['bounded']}, every candidate "
          f"{fits['every']}; at the largest the bound takes "
          f"{rows[-1]['bounded_s'] / max(rows[-1]['every_s'], 1e-6):.2f} of the unbounded time")
    (HERE / "results" / "focus_cost.json").write_text(json.dumps({"rows": rows, "exponents": fits}, indent=2) + "\n")


if __name__ == "__main__":
    main()
