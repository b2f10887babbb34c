"""What `alignment.conflicts` costs on a sentence past `DIFF_LIMIT`, compared in runs, against diffing it whole.

Two shapes of one long sentence copied by an answer: repetitive text, on which `difflib` slows with about the cube of
the length ("usually only usually only ..." against "only only ..."), and a scraped list that never ends a sentence,
copied with one changed price. The whole-sentence diff (the baseline, measured in the same run) is timed only up to
`--whole-up-to` words: past that it takes minutes.

A second table times how a sentence's names are read (`_Words.of`) on capitalised text, against version 4's way of
telling a sentence's first word from a name (a regex searched over everything before each capitalised word, which
grows with the square of the length), measured in the same run. No judge, no model. Prints both tables and writes
benchmarks/results/alignment_cost.json.

    python benchmarks/alignment_cost.py [--words 250,500,1000,2000,4000,16000] [--whole-up-to 1000]
                                        [--name-words 2000,8000,16000]
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Callable
from pathlib import Path

from morphguard.detectors.alignment import _differences, _Words, conflicts
from morphguard.detectors.text import TOKEN

HERE = Path(__file__).resolve().parent
COLOURS = ["amber", "green", "grey", "pink", "white", "black", "blue", "red"]


def repetitive(words: int) -> tuple[str, list[str]]:
    return ("The drug is " + "usually only " * (words // 2) + "safe for adults.",
            ["The drug is " + "only " * words + "safe for adults."])


def scraped_list(words: int) -> tuple[str, list[str]]:
    items = [f"the {COLOURS[i % len(COLOURS)]} kettle costs {1000 + 7 * i} dollars" for i in range(words // 6)]
    middle = len(items) // 2
    context = "Prices " + " ".join(items)
    changed = items[middle].replace(str(1000 + 7 * middle), str(1003 + 7 * middle))  # a price no kettle has
    answer = "Prices " + " ".join(items[:middle] + [changed] + items[middle + 1:])
    return answer, [context]


VERSION_4_OPENING = re.compile(r"(?:^|[.!?:;\n]\s*)$")


def names_as_version_4(text: str) -> frozenset[int]:
    found = list(TOKEN.finditer(text))
    return frozenset(i for i, m in enumerate(found)
                     if m.group()[0].isupper() and i > 0 and not VERSION_4_OPENING.search(text, 0, m.start()))


def seconds(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--words", default="250,500,1000,2000,4000,16000")
    parser.add_argument("--whole-up-to", type=int, default=1000)
    parser.add_argument("--name-words", default="2000,8000,16000")
    args = parser.parse_args()
    rows = []
    for shape, make in (("repetitive", repetitive), ("scraped list", scraped_list)):
        for words in (int(w) for w in args.words.split(",")):
            answer, context = make(words)
            runs = seconds(lambda: conflicts(answer, context))  # noqa: B023 (called at once)
            kinds = sorted({c.kind for c in conflicts(answer, context)})
            whole = (seconds(lambda: _differences(_Words.of(context[0]), _Words.of(answer),  # noqa: B023
                                                  frozenset(), frozenset()))
                     if words <= args.whole_up_to else None)
            rows.append({"shape": shape, "words": words, "runs_s": runs, "whole_s": whole,
                         "whole_over_runs": whole / runs if whole is not None else None, "kinds": kinds})
    print(f"{'shape':<13} {'words':>6} {'in runs s':>10} {'whole s':>9} {'whole/runs':>11}  kinds found in runs")
    for r in rows:
        whole = f"{r['whole_s']:.3f}" if r["whole_s"] is not None else "-"
        ratio = f"{r['whole_over_runs']:.1f}" if r["whole_over_runs"] is not None else "-"
        print(f"{r['shape']:<13} {r['words']:>6} {r['runs_s']:>10.3f} {whole:>9} {ratio:>11}  {', '.join(r['kinds'])}")
    names = []
    for words in (int(w) for w in args.name_words.split(",")):
        text = "Alpha Beta " * (words // 2)
        assert _Words.of(text).names == names_as_version_4(text)
        now, before = seconds(lambda: _Words.of(text)), seconds(lambda: names_as_version_4(text))  # noqa: B023
        names.append({"words": words, "now_s": now, "version_4_s": before, "version_4_over_now": before / now})
    print(f"\n{'names: words':>13} {'now s':>9} {'version 4 s':>12} {'v4/now':>8}")
    for r in names:
        print(f"{r['words']:>13} {r['now_s']:>9.3f} {r['version_4_s']:>12.3f} {r['version_4_over_now']:>8.1f}")
    out = HERE / "results" / "alignment_cost.json"
    out.write_text(json.dumps({"comparison": rows, "names": names}, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
