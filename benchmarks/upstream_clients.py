"""What each candidate HTTP client costs the proxy per upstream call: httpx, httpcore directly, aiohttp.

The proxy's upstream client runs once per request on the proxy's own CPU, so its cost is CPU time in this
process, not wall time. Each client sends the same chat request sequentially to the fixed upstream
(benchmarks/fixed_upstream.py, started here on loopback and pinned to another core where there is one),
pooled keep-alive connections, body read in full; the table gives CPU ms and wall ms per call.

    python benchmarks/upstream_clients.py [--requests 3000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from proxy_overhead import BODY, free_port, process  # noqa: E402

PAYLOAD = json.dumps(BODY).encode()
HEADERS = {"authorization": "Bearer sk-bench", "content-type": "application/json"}


async def httpx_client(url: str, n: int) -> None:
    import httpx

    async with httpx.AsyncClient() as client:
        for _ in range(n):
            response = await client.post(url, content=PAYLOAD, headers=HEADERS)
            assert response.status_code == 200


async def httpcore_pool(url: str, n: int) -> None:
    import httpcore

    headers = [(k.encode(), v.encode()) for k, v in HEADERS.items()]
    async with httpcore.AsyncConnectionPool() as pool:
        for _ in range(n):
            response = await pool.request("POST", url, headers=headers, content=PAYLOAD)
            assert response.status == 200


async def aiohttp_session(url: str, n: int) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        for _ in range(n):
            async with session.post(url, data=PAYLOAD, headers=HEADERS) as response:
                await response.read()
                assert response.status == 200


CLIENTS: dict[str, Callable[[str, int], Awaitable[None]]] = {
    "httpx": httpx_client, "httpcore": httpcore_pool, "aiohttp": aiohttp_session}


def measure(client: Callable[[str, int], Awaitable[None]], url: str, n: int) -> dict[str, float]:
    asyncio.run(client(url, 50))  # warm-up: imports, first connection
    cpu, wall = time.process_time(), time.perf_counter()
    asyncio.run(client(url, n))
    return {"cpu_ms": (time.process_time() - cpu) * 1000 / n, "wall_ms": (time.perf_counter() - wall) * 1000 / n}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "upstream_clients.json")
    args = parser.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) > 1:
        os.sched_setaffinity(0, cores[:1])  # this process on the first core, the upstream on the rest
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        upstream = ["taskset", "-c", ",".join(map(str, cores[1:]))] if len(cores) > 1 else []
        with process([*upstream, sys.executable, str(HERE / "fixed_upstream.py"), str(port), "0"],
                     url.replace("chat/completions", "models"), Path(tmp) / "upstream.log"):
            for name, client in CLIENTS.items():
                rows.append({"client": name, **measure(client, url, args.requests)})
    print(f"{'client':<10} {'CPU ms/call':>12} {'wall ms/call':>13}")
    for row in rows:
        print(f"{row['client']:<10} {row['cpu_ms']:>12.3f} {row['wall_ms']:>13.3f}")
    args.out.write_text(json.dumps({"requests": args.requests, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
