"""How fast `morphguard replay` goes: stored decisions re-decided and re-checked a second.

Fills a fresh SQLite audit store with `--rows` decisions of the live default policy (a third flagged and keeping
their texts, as `policy.audit.keep_text: flagged` leaves them; RAG-sized texts: five passages of about 600
characters, an answer of six sentences), then runs the command as a user does (`morphguard replay`, in this
process) at depth `decide` over every row and at depth `check` with the `grounding` detector over `--check-rows` of
the kept ones. Prints rows a second for each and writes benchmarks/results/replay.json.

    python benchmarks/replay.py [--rows 20000] [--check-rows 500]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import yaml

from morphguard.config import AuditSettings
from morphguard.policy.audit import AuditStore
from morphguard.policy.record import DecisionRecord
from tests.commands import morphguard

HERE = Path(__file__).resolve().parent
WORDS = ("museum clinic ward opens closes weekday morning evening entry ticket child adult price free guided tour "
         "hall floor garden library archive exhibit season winter summer holiday member visitor staff").split()


def _sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 16))).capitalize() + "."


def fill(path: Path, rows: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    store = AuditStore(AuditSettings(path=str(path), store_text="hash"))
    batch = []
    for n in range(rows):
        score = rng.random()
        flagged = score >= 0.3
        texts = {}
        if flagged:
            passages = [" ".join(_sentence(rng) for _ in range(6)) for _ in range(5)]
            texts = {"question": _sentence(rng), "context": "\n\n".join(passages),
                     "answer": " ".join(_sentence(rng) for _ in range(6))}
        batch.append(DecisionRecord(request_id=f"r{n}", profile="general", topic="general", checked=True,
                                    score=round(score, 4), threshold=0.3, flagged=flagged,
                                    action="annotate" if flagged else "pass", detector="sentences", **texts))
        if len(batch) == 1000:
            store.record_many(batch)
            batch = []
    if batch:
        store.record_many(batch)
    store.close()


def timed(folder: Path, *args: str) -> float:
    started = time.perf_counter()
    result = morphguard("replay", "--config", "live.yaml", *args, cwd=folder)
    if result.returncode != 0:
        raise SystemExit(result.stderr)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--check-rows", type=int, default=500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        fill(folder / "audit.db", args.rows)
        live = {"policy": {"audit": {"path": str(folder / "audit.db"), "store_text": "hash"}}}
        (folder / "live.yaml").write_text(yaml.safe_dump(live), encoding="utf-8")
        (folder / "stricter.yaml").write_text("policy:\n  profiles:\n    general:\n      threshold: 0.2\n      "
                                              "action: block\n", encoding="utf-8")
        (folder / "grounding.yaml").write_text("detector:\n  name: grounding\n", encoding="utf-8")
        decide_s = timed(folder, "--candidate", "stricter.yaml", "--out", "decide")
        check_s = timed(folder, "--candidate", "grounding.yaml", "--depth", "check", "--flagged",
                        "--limit", str(args.check_rows), "--out", "check")
    result = {"rows": args.rows, "decide_s": round(decide_s, 3), "decide_per_s": round(args.rows / decide_s),
              "check_rows": args.check_rows, "check_s": round(check_s, 3),
              "check_per_s": round(args.check_rows / check_s, 1)}
    print(json.dumps(result, indent=2))
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "replay.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
