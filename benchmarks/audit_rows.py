"""What one audit row costs the proxy's process: the insert itself, and handed over from the event loop.

CPU time in this process per row, on a throwaway SQLite file (WAL, as the proxy runs it): `AuditStore.record`
called directly; handed to a worker thread per row (`asyncio.to_thread`, as the guard did before the audit
writer); through `AuditWriter` one row at a time (concurrency 1); and through `AuditWriter` with every row
in flight at once (a burst, committed in groups). Then the pages one row writes: a store already holding
`--prefill` rows takes 200 rows, each committed alone, and SQLite's write-ahead log says how many pages they
wrote (the table's and each index's that the row touches). Then the price of durability, A/B in one run on a
folder of the disk under the working directory (`--dir`; not a RAM disk, where a flush costs nothing): each
`policy.audit.synchronous` setting, `normal` (a commit not flushed) and `full` (flushed before it returns), through
the writer one row at a time (the wall time a request waits for its row) and with every row in flight at once (rows
a second, in group commits). Prints tables and writes benchmarks/results/audit_rows.json.

    python benchmarks/audit_rows.py [--rows 3000] [--prefill 20000] [--durable-rows 500] [--dir .]
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
    parser.add_argument("--durable-rows", type=int, default=500, help="rows per setting in the durability A/B")
    parser.add_argument("--dir", type=Path, default=Path.cwd(), help="where the A/B's stores live (a real disk)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "audit_rows.json")
    args = parser.parse_args()
    n = args.rows
    with tempfile.TemporaryDirectory() as folder:
        store = AuditStore(AuditSettings(path=str(Path(folder) / "audit.db"), synchronous="normal"))
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
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        durability = {mode: flushed(Path(folder) / f"{mode}.db", mode, args.durable_rows)
                      for mode in ("normal", "full", "normal again", "full again")}
    print(f"\n{'synchronous, ' + str(args.durable_rows) + ' rows':<26} {'ms/row alone':>12} {'CPU ms/row':>10} "
          f"{'burst rows/s':>12}")
    for mode, figures in durability.items():
        print(f"{mode:<26} {figures['wall_ms_per_row_alone']:>12.3f} {figures['cpu_ms_per_row_alone']:>10.3f} "
              f"{figures['burst_rows_per_s']:>12.0f}")
    args.out.write_text(json.dumps({"rows": n, "cpu_ms_per_row": results, "prefill": args.prefill,
                                    "wal_pages_per_row": pages, "durability": durability}, indent=2))


def flushed(path: Path, mode: str, rows: int) -> dict[str, float]:
    """Through the writer under `policy.audit.synchronous: <mode>`: the wall and CPU time of a row written alone
    (awaited before the next), and rows a second with every row in flight at once."""
    store = AuditStore(AuditSettings(path=str(path), synchronous=mode.split()[0]))
    writer = AuditWriter(store)

    async def alone() -> None:
        for _ in range(rows):
            await writer.write(row())

    async def burst() -> None:
        await asyncio.gather(*(writer.write(row()) for _ in range(rows)))

    wall, cpu = time.perf_counter(), time.process_time()
    uvloop.run(alone())
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    started = time.perf_counter()
    uvloop.run(burst())
    burst_s = time.perf_counter() - started
    writer.close()
    store.close()
    return {"wall_ms_per_row_alone": wall * 1000 / rows, "cpu_ms_per_row_alone": cpu * 1000 / rows,
            "burst_rows_per_s": rows / burst_s}


def pages_per_row(path: Path, prefill: int, rows: int = 200) -> float:
    """Write-ahead log pages per row committed alone, in a store already holding `prefill` rows."""
    store = AuditStore(AuditSettings(path=str(path), synchronous="normal"))
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
