"""What `alignment.conflicts` costs on a sentence past `DIFF_LIMIT`, compared in runs, against diffing it whole.

Two shapes of one long sentence copied by an answer: repetitive text, on which `difflib` slows with about the cube of
the length ("usually only usually only ..." against "only only ..."), and a scraped list that never ends a sentence,
copied with one changed price. The whole-sentence diff (the baseline, measured in the same run) is timed only up to
`--whole-up-to` words: past that it takes minutes.

A second table times how a sentence's names are read (`_Words.of`) on capitalised text, against version 4's way of
telling a sentence's first word from a name (a regex searched over everything before each capitalised word, which
grows with the square of the length), measured in the same run.

A third table times a whole `grounding` check (unsupported words, the rules and the alignment) on prose-shaped text
of growing size, the answer and the context each `--prose` characters: sentences of 15 words drawn from a Zipf
vocabulary of 3,000, half the answer's sentences copies of context sentences. Beside it, the alignment as it was
before it read candidates rarest word first (every context sentence sharing a word with an answer sentence compared
with it, `EveryCandidate`), up to `--every-up-to` characters. Each column's growth is fitted (least squares of
log time on log size) and its exponent printed: 1 is linear, 2 the square. CPU seconds (`time.process_time`).
No judge, no model. Prints the tables and writes benchmarks/results/alignment_cost.json.

    python benchmarks/alignment_cost.py [--words 250,500,1000,2000,4000,16000] [--whole-up-to 1000]
                                        [--name-words 2000,8000,16000] [--prose 25000,50000,100000,200000]
                                        [--every-up-to 100000]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import time
from collections.abc import Callable
from pathlib import Path

from morphguard.detectors import alignment
from morphguard.detectors.alignment import Context, _differences, _Words, conflicts
from morphguard.detectors.grounding import Grounding, GroundingSettings
from morphguard.detectors.text import TOKEN, content_keys
from morphguard.models import RagInput

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


class EveryCandidate(Context):
    """The alignment's search as it was: every context sentence sharing a content word with the answer sentence
    scored (the baseline of the prose table)."""

    def copied(self, text: str) -> tuple[int, float] | None:
        claim = frozenset(content_keys(text))
        known = [k for k in claim if k in self.frequency]
        if not known:
            return None
        weight = {k: math.log(1 + self.sentences / self.frequency[k]) if k in self.frequency
                  else math.log(1 + self.sentences) for k in claim}
        total = math.fsum(weight.values())
        candidates = {i for k in known for i in self.holding[k]}
        return max(((i, math.fsum(weight[k] for k in claim & self.held[i]) / total) for i in candidates),
                   key=lambda pair: (pair[1], -pair[0]))


def prose(chars: int, seed: int = 0) -> tuple[str, list[str]]:
    """An answer and a context of about `chars` characters each (see the module's docstring)."""
    rng = random.Random(seed)
    vocabulary = [f"w{i}x" for i in range(3000)]
    weights = [1 / (i + 1) for i in range(3000)]

    def sentence() -> str:
        return " ".join(rng.choices(vocabulary, weights, k=15)).capitalize() + "."

    context: list[str] = []
    while sum(len(s) + 1 for s in context) < chars:
        context.append(sentence())
    answer: list[str] = []
    while sum(len(s) + 1 for s in answer) < chars:
        answer.append(rng.choice(context) if rng.random() < 0.5 else sentence())
    return " ".join(answer), [" ".join(context)]


def cpu(call: Callable[[], object]) -> float:
    started = time.process_time()
    call()
    return time.process_time() - started


def exponent(points: list[tuple[float, float]]) -> float | None:
    """The slope of log time on log size (least squares): how the time grows with the size."""
    if len(points) < 2:
        return None
    xs, ys = [math.log(x) for x, _ in points], [math.log(y) for _, y in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def seconds(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--words", default="250,500,1000,2000,4000,16000")
    parser.add_argument("--whole-up-to", type=int, default=1000)
    parser.add_argument("--name-words", default="2000,8000,16000")
    parser.add_argument("--prose", default="25000,50000,100000,200000")
    parser.add_argument("--every-up-to", type=int, default=100_000)
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
    grounding = Grounding(GroundingSettings())
    checks = []
    for chars in (int(c) for c in args.prose.split(",")):
        answer, context = prose(chars)
        rag = RagInput(question="What do the documents say?", passages=context)
        now = cpu(lambda: grounding.measure(rag, answer))  # noqa: B023
        before = None
        if chars <= args.every_up_to:
            alignment.Context = EveryCandidate  # type: ignore[misc]
            try:
                before = cpu(lambda: grounding.measure(rag, answer))  # noqa: B023
            finally:
                alignment.Context = Context  # type: ignore[misc]
        checks.append({"chars_each": chars, "now_cpu_s": now, "every_candidate_cpu_s": before,
                       "every_over_now": before / now if before else None})
    fits = {"now": exponent([(r["chars_each"], r["now_cpu_s"]) for r in checks]),
            "every_candidate": exponent([(r["chars_each"], r["every_candidate_cpu_s"]) for r in checks
                                         if r["every_candidate_cpu_s"]])}
    print(f"\n{'prose: chars each':>17} {'now cpu s':>10} {'every cand. s':>14} {'every/now':>10}")
    for r in checks:
        before = f"{r['every_candidate_cpu_s']:.3f}" if r["every_candidate_cpu_s"] is not None else "-"
        ratio = f"{r['every_over_now']:.1f}" if r["every_over_now"] is not None else "-"
        print(f"{r['chars_each']:>17} {r['now_cpu_s']:>10.3f} {before:>14} {ratio:>10}")
    print("fitted exponent (time ~ size^k): " + ", ".join(
        f"{name} k={k:.2f}" if k is not None else f"{name} -" for name, k in fits.items()))
    out = HERE / "results" / "alignment_cost.json"
    out.write_text(json.dumps({"comparison": rows, "names": names, "prose": checks, "prose_exponents": fits},
                              indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
