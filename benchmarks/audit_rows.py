"""What one audit row costs the proxy's process: the insert itself, and handed over from the event loop.

CPU time in this process per row, on a throwaway SQLite file (WAL, as the proxy runs it): `AuditStore.record`
called directly; handed to a worker thread per row (`asyncio.to_thread`, as the guard did before the audit
writer); through `AuditWriter` one row at a time (concurrency 1); and through `AuditWriter` with every row
in flight at once (a burst, committed in groups). Then the pages one row writes: a store already holding
`--prefill` rows takes 200 rows, each committed alone, and SQLite's write-ahead log says how many pages they
wrote (the table's and each index's that the row touches). Prints a table and writes
benchmarks/results/audit_rows.json.

    python benchmarks/audit_rows.py [--rows 3000] [--prefill 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import uvloop

from morphguard.config import AuditSettings
from morphguard.policy.audit import AuditStore
from morphguard.policy.audit_writer import AuditWriter
from morphguard.policy.record import DecisionRecord

HERE = Path(__file__).resolve().parent
ROW = DecisionRecord(request_id="r", profile="general", topic="general", reason="no_context", model="bench",
                     answer="The Eiffel Tower is in Paris.")


def row() -> DecisionRecord:
    """ROW under a request id of its own: a request id already recorded is not written again."""
    return ROW.model_copy(update={"request_id": uuid.uuid4().hex})


def per_row(run: Callable[[], None], rows: int) -> float:
    started = time.process_time()
    run()
    return (time.process_time() - started) * 1000 / rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=3000)
    parser.add_argument("--prefill", type=int, default=20_000, help="rows in the store before the pages are counted")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "audit_rows.json")
    args = parser.parse_args()
    n = args.rows
    with tempfile.TemporaryDirectory() as folder:
        store = AuditStore(AuditSettings(path=str(Path(folder) / "audit.db")))
        writer = AuditWriter(store)

        async def threaded() -> None:
            for _ in range(n):
                await asyncio.to_thread(store.record, row())

        async def one_at_a_time() -> None:
            for _ in range(n):
                await writer.write(row())

        async def burst() -> None:
            await asyncio.gather(*(writer.write(row()) for _ in range(n)))

        results = {
            "direct insert": per_row(lambda: [store.record(row()) for _ in range(n)], n),
            "to_thread per row": per_row(lambda: uvloop.run(threaded()), n),
            "writer, one at a time": per_row(lambda: uvloop.run(one_at_a_time()), n),
            "writer, all at once": per_row(lambda: uvloop.run(burst()), n),
        }
        writer.close()
        store.close()
        pages = pages_per_row(Path(folder) / "pages.db", args.prefill)
    print(f"{'audit row, ' + str(n) + ' rows':<26} {'CPU ms/row':>10}")
    for name, ms in results.items():
        print(f"{name:<26} {ms:>10.3f}")
    print(f"pages written per row committed alone, {args.prefill:,} rows stored: {pages:.2f}")
    args.out.write_text(json.dumps({"rows": n, "cpu_ms_per_row": results, "prefill": args.prefill,
                                    "wal_pages_per_row": pages}, indent=2))


def pages_per_row(path: Path, prefill: int, rows: int = 200) -> float:
    """Write-ahead log pages per row committed alone, in a store already holding `prefill` rows."""
    store = AuditStore(AuditSettings(path=str(path)))
    for start in range(0, prefill, 500):
        store.record_many([row() for _ in range(min(500, prefill - start))])
    counter = sqlite3.connect(path)
    counter.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the log starts empty
    for _ in range(rows):  # as the event loop commits them: its connection leaves checkpoints to the writer
        store.record_at_once([row()])
    frames = counter.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1]
    counter.close()
    store.close()
    return frames / rows


if __name__ == "__main__":
    main()
