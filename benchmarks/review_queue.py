"""Does the review queue stay fast as the audit trail grows? Page times at 1,000 and 100,000 decisions.

An SQLite audit store (the default) is filled with N decisions (a third flagged, a tenth of those
reviewed, five topics), then the console's queue query (`ReviewStore.queue`) is timed for: the first
page newest first, the 50th page (following cursors), the first page by highest score, a topic filter
and "not reviewed yet". Medians of 20 runs each; the 1,000-row store is the baseline of the ratios.
Prints a table and writes benchmarks/results/review_queue.json.

    python benchmarks/review_queue.py [--sizes 1000,100000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from morphguard.config import AuditSettings  # noqa: E402
from morphguard.policy.audit import AuditStore, decisions, reviews  # noqa: E402
from morphguard.policy.reviews import QueueFilter, ReviewStore  # noqa: E402

TOPICS = ("general", "healthcare", "pregnancy", "migration", "finance")


def fill(store: AuditStore, n: int) -> None:
    rng = random.Random(0)
    rows, judged = [], []
    for i in range(1, n + 1):
        flagged = rng.random() < 1 / 3
        rows.append({"id": i, "time": f"2026-11-{1 + i * 20 // n:02d}T00:00:00.000+00:00", "request_id": f"r{i}",
                     "profile": "general", "topic": rng.choice(TOPICS), "checked": True, "score": rng.random(),
                     "threshold": 0.5, "flagged": flagged, "action": "annotate", "escalated": False,
                     "factoids": [], "regenerations": 0})
        if flagged and rng.random() < 0.1:
            judged.append({"time": "2026-11-22T00:00:00", "decision_id": i, "request_id": f"r{i}",
                           "reviewer": "bench", "label": rng.choice(("hallucinated", "faithful"))})
    with store.engine.begin() as db:
        db.execute(decisions.insert(), rows)
        if judged:
            db.execute(reviews.insert(), judged)


def median_ms(action, runs: int = 20) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        action()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def measure(n: int, folder: Path) -> dict[str, float]:
    store = AuditStore(AuditSettings(path=str(folder / f"audit-{n}.db")))
    fill(store, n)
    queue = ReviewStore(store)

    def page(where: QueueFilter, pages: int = 1) -> None:
        cursor = None
        for _ in range(pages):
            _rows, cursor = queue.queue(where, cursor, 50)

    cursors: list[str | None] = [None]
    for _ in range(49):  # the cursor of page 50, found once; then only that page is timed
        cursors.append(queue.queue(QueueFilter(), cursors[-1], 50)[1])
    deep = cursors[-1]
    out = {
        "first page, newest": median_ms(lambda: page(QueueFilter())),
        # a store with fewer than 50 pages has no page 50 (NaN in the table)
        "page 50, newest": median_ms(lambda: queue.queue(QueueFilter(), deep, 50)) if deep else float("nan"),
        "first page, highest score": median_ms(lambda: page(QueueFilter(order="score"))),
        "topic filter": median_ms(lambda: page(QueueFilter(topic="pregnancy"))),
        "not reviewed yet": median_ms(lambda: page(QueueFilter(reviewed=False))),
        "reviewed only": median_ms(lambda: page(QueueFilter(reviewed=True))),
    }
    store.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,100000")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        results = {n: measure(n, Path(tmp)) for n in sizes}
    base = results[sizes[0]]
    print(f"review queue query, ms (median of 20; SQLite; {os.cpu_count()} cores)")
    print("| query | " + " | ".join(f"{n:,} rows" for n in sizes) + f" | ratio {sizes[-1]:,} / {sizes[0]:,} |")
    print("|---|" + "---|" * (len(sizes) + 1))
    for query in base:
        cells = " | ".join(f"{results[n][query]:.2f}" for n in sizes)
        print(f"| {query} | {cells} | {results[sizes[-1]][query] / base[query]:.1f}× |")
    out = ROOT / "benchmarks" / "results" / "review_queue.json"
    out.write_text(json.dumps({"sizes": sizes, "ms": {str(n): r for n, r in results.items()}}, indent=2) + "\n")
    print(f"written {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
