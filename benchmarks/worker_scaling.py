"""Checks per second with 1, 2 and 4 `morphguard worker` processes on Redis Streams and PostgreSQL.

The judge is the scripted provider with a fixed delay per call (`judge-<N>ms`), so the workers' own cost
and the queue and store are what scale or not. For each worker count, in one run: a proxy replica (async
mode, enqueue only) and the workers start; then the clock runs from the first of N requests (each with
its own question, so no cache answers) until all N are in the audit trail. The proxy enqueues far faster
than the workers check, so throughput = N / that time; the 1-worker figure is the baseline of the ratios.
Redis and PostgreSQL are throwaway servers on loopback (tests/servers.py).
Prints a table and writes benchmarks/results/worker_scaling.json.

    python benchmarks/worker_scaling.py [--requests 400] [--judge-ms 250] [--concurrency 4] [--workers 1,2,4]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psycopg
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import servers  # noqa: E402  (the same throwaway servers the tests use)


def start(cmd: list[str], log: Path, ready: str | None = None, url: str | None = None) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(cmd, cwd=ROOT, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{cmd} exited:\n{log.read_text()}")
        if ready is not None and ready in log.read_text():
            return process
        if url is not None:
            try:
                if httpx.get(url, timeout=1).status_code < 500:
                    return process
            except httpx.HTTPError:
                pass
        time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"{cmd} not ready:\n{log.read_text()}")


def audited(url: str) -> int:
    with psycopg.connect(url) as db:
        row = db.execute("SELECT count(*) FROM decisions").fetchone()
    return int(row[0]) if row else 0


def one_round(workers: int, args: argparse.Namespace, provider: str, redis_url: str, pg_server: str,
              folder: Path) -> dict[str, float]:
    database = servers.fresh_database(pg_server, f"bench_{workers}_{uuid.uuid4().hex[:6]}")
    config = {
        "judge": {"model": f"openai/judge-{args.judge_ms}ms", "api_base": provider, "api_key": "sk-judge",
                  "max_attempts": 1},
        "detector": {"name": "direct"},
        "proxy": {"upstream": {"base_url": provider}, "mode": "async", "workers": 0, "queue_size": 100_000},
        "queue": {"url": redis_url, "fleet_key": servers.FLEET_KEY, "stream": f"bench:{uuid.uuid4().hex[:8]}"},
        "store": {"url": database},
        "policy": {"profiles": {"general": {"action": "annotate", "topics": {}}}, "audit": {"path": "unused.db"}},
    }
    path = folder / f"config-{workers}.yaml"
    path.write_text(yaml.safe_dump(config))
    port = servers.free_port()
    proxy = start([sys.executable, "-m", "morphguard.cli", "serve", "--config", str(path), "--port", str(port)],
                  folder / f"proxy-{workers}.log", url=f"http://127.0.0.1:{port}/healthz")
    started: list[subprocess.Popen[bytes]] = [proxy]
    try:
        for i in range(workers):
            started.append(start([sys.executable, "-m", "morphguard.cli", "worker", "--config", str(path),
                                  "--concurrency", str(args.concurrency)], folder / f"worker-{workers}-{i}.log",
                                 ready="checks at once"))

        def body(i: int) -> dict[str, object]:
            return {"model": "hallucinated", "messages": [{"role": "user", "content": f"Can I take ibuprofen? ({i})"}],
                    "morphguard": {"context": "Ibuprofen is contraindicated in the third trimester of pregnancy."}}

        clock = time.perf_counter()
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client, ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(lambda i: client.post("/v1/chat/completions", json=body(i)).status_code,
                                  range(args.requests)))
        assert codes.count(200) == args.requests, codes
        while audited(database) < args.requests:
            time.sleep(0.1)
        seconds = time.perf_counter() - clock
    finally:
        for process in started:
            process.terminate()
            process.wait(timeout=30)
    return {"workers": workers, "seconds": round(seconds, 2), "checks_per_s": round(args.requests / seconds, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--judge-ms", type=int, default=250)
    parser.add_argument("--concurrency", type=int, default=4, help="checks at once per worker")
    parser.add_argument("--workers", default="1,2,4")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        provider_port = servers.free_port()
        provider = start([sys.executable, "-m", "tests.e2e.fake_provider", str(provider_port)], folder / "p.log",
                         url=f"http://127.0.0.1:{provider_port}/v1/models")
        try:
            with servers.redis_server(folder) as redis_url, servers.postgres_server() as pg_server:
                rows = [one_round(int(n), args, f"http://127.0.0.1:{provider_port}/v1", redis_url, pg_server, folder)
                        for n in args.workers.split(",")]
        finally:
            provider.terminate()
    base = rows[0]["checks_per_s"] / rows[0]["workers"]
    for row in rows:
        row["speedup"] = round(row["checks_per_s"] / rows[0]["checks_per_s"], 2)
        row["efficiency"] = round(row["checks_per_s"] / (base * row["workers"]), 2)
    ideal = args.concurrency * 1000 / args.judge_ms
    print(f"{args.requests} checks, judge {args.judge_ms} ms per call, {args.concurrency} checks at once per worker "
          f"(ideal {ideal:.0f} checks/s per worker), {os.cpu_count()} cores")
    print("| workers | seconds | checks/s | speed-up vs 1 | efficiency |\n|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['workers']} | {row['seconds']} | {row['checks_per_s']} | {row['speedup']}× | "
              f"{row['efficiency']:.0%} |")
    out = ROOT / "benchmarks" / "results" / "worker_scaling.json"
    out.write_text(json.dumps({"machine": {"cores": os.cpu_count(), "python": platform.python_version()},
                               "settings": vars(args), "rows": rows}, indent=2) + "\n")
    print(f"written {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
