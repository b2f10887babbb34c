"""What morphguard adds to a request, against calling the upstream directly and against the LiteLLM proxy.

One fixed-latency OpenAI-compatible upstream runs on loopback; in the same run, the same RAG chat request is
sent at concurrency 1, 16 and 64 to: the upstream directly, morphguard with checks off (no context source
enabled), morphguard in async mode (checks on a background queue, the fixed upstream serving as judge too),
and the LiteLLM proxy as a plain pass-through (skipped when `litellm[proxy]` is not installed:
`pip install -e '.[bench]'`). Prints a table and writes benchmarks/results/proxy_overhead.json.

    python benchmarks/proxy_overhead.py [--latency-ms 50] [--requests 400] [--concurrency 1,16,64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import yaml

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no remote cost-map fetch, here or in children
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BODY = {
    "model": "bench",
    "messages": [{"role": "user", "content": "<context>The Eiffel Tower is in Paris, France.</context>\n"
                                             "Where is the Eiffel Tower?"}],
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def process(cmd: list[str], ready_url: str, log: Path, env: dict[str, str] | None = None,
            timeout: float = 120) -> Iterator[None]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{cmd[:3]} exited:\n{log.read_text()[-2000:]}")
            try:
                if httpx.get(ready_url, timeout=1).status_code < 500:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{cmd[:3]} not ready after {timeout} s:\n{log.read_text()[-2000:]}")
            time.sleep(0.2)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def morphguard(folder: Path, upstream: str, name: str, **proxy: object) -> tuple[list[str], str, Path]:
    port = free_port()
    config = {
        "judge": {"model": "openai/bench", "api_base": upstream, "api_key": "sk-bench"},
        "metarag": {"profile": "paper"},
        "proxy": {"upstream": {"base_url": upstream}, **proxy},  # the client's key is forwarded
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    cmd = [sys.executable, "-m", "morphguard.cli", "serve", "--config", str(path), "--port", str(port)]
    return cmd, f"http://127.0.0.1:{port}", folder / f"{name}.log"


def litellm_proxy(folder: Path, upstream: str) -> tuple[list[str], str, Path] | None:
    binary = Path(sys.executable).with_name("litellm")
    if not binary.exists() and not shutil.which("litellm"):
        return None
    try:
        import litellm.proxy.proxy_server  # noqa: F401  (only present with litellm[proxy])
    except ImportError:
        return None
    port = free_port()
    path = folder / "litellm.yaml"
    path.write_text(yaml.safe_dump({"model_list": [{"model_name": "bench", "litellm_params": {
        "model": "openai/bench", "api_base": upstream, "api_key": "sk-bench"}}]}))
    cmd = [str(binary if binary.exists() else shutil.which("litellm")), "--config", str(path), "--port", str(port),
           "--num_workers", "1"]
    return cmd, f"http://127.0.0.1:{port}", folder / "litellm.log"


async def load(base_url: str, concurrency: int, requests: int) -> dict[str, float]:
    """Send `requests` chat completions, `concurrency` at a time; latency percentiles in ms and requests/s."""
    latencies: list[float] = []
    failures = 0
    queue = iter(range(requests))
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=60,
                                 headers={"Authorization": "Bearer sk-bench"}) as client:
        async def worker() -> None:
            nonlocal failures
            for _ in queue:
                started = time.perf_counter()
                response = await client.post("/v1/chat/completions", json=BODY)
                if response.status_code != 200:
                    failures += 1
                latencies.append((time.perf_counter() - started) * 1000)

        for _ in range(min(20, requests)):  # warm-up: connections, imports, caches
            await client.post("/v1/chat/completions", json=BODY)
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - started
    q = statistics.quantiles(latencies, n=100, method="inclusive")
    return {"p50": statistics.median(latencies), "p95": q[94], "p99": q[98], "rps": len(latencies) / wall,
            "failures": failures, "requests": len(latencies)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latency-ms", type=float, default=50.0, help="the upstream's fixed delay")
    parser.add_argument("--requests", type=int, default=400, help="requests per target and concurrency")
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "proxy_overhead.json")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]

    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        folder = Path(tmp)
        port = free_port()
        upstream = f"http://127.0.0.1:{port}/v1"
        stack.enter_context(process([sys.executable, str(HERE / "fixed_upstream.py"), str(port), str(args.latency_ms)],
                                    f"{upstream}/models", folder / "upstream.log"))
        targets: dict[str, tuple[list[str], str, Path] | None] = {
            "morphguard, checks off": morphguard(folder, upstream, "off", context={"sources": []}),
            "morphguard, async checks": morphguard(folder, upstream, "async", mode="async"),
            "litellm proxy": litellm_proxy(folder, upstream),
        }
        bases = {"direct": upstream.removesuffix("/v1")}
        for name, spec in targets.items():
            if spec is None:
                print(f"skipped {name}: litellm[proxy] is not installed (pip install -e '.[bench]')", file=sys.stderr)
                continue
            cmd, base, log = spec
            env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True"} if name.startswith("litellm") else None
            stack.enter_context(process(cmd, f"{base}/v1/models" if name.startswith("litellm") else f"{base}/healthz",
                                        log, env=env, timeout=180))
            bases[name] = base
        for concurrency in levels:
            requests = max(args.requests, 4 * concurrency) if concurrency > 1 else min(args.requests, 100)
            for name, base in bases.items():
                print(f"… {name} at concurrency {concurrency}", file=sys.stderr)
                measured = asyncio.run(load(base, concurrency, requests))
                rows.append({"target": name, "concurrency": concurrency, **measured})

    direct = {r["concurrency"]: r for r in rows if r["target"] == "direct"}
    header = (f"{'target':<26} {'conc':>4} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'req/s':>8} "
              f"{'+p50 ms':>8} {'p50 ×':>6} {'fail':>4}")
    lines = [f"proxy overhead: upstream fixed at {args.latency_ms:.0f} ms, {platform.node()} "
             f"({os.cpu_count()} cores), Python {platform.python_version()}", header, "-" * len(header)]
    for r in rows:
        base = direct[r["concurrency"]]
        r["added_p50_ms"] = r["p50"] - base["p50"]
        r["p50_ratio"] = r["p50"] / base["p50"]
        lines.append(f"{r['target']:<26} {r['concurrency']:>4} {r['p50']:>8.1f} {r['p95']:>8.1f} {r['p99']:>8.1f} "
                     f"{r['rps']:>8.1f} {r['added_p50_ms']:>8.1f} {r['p50_ratio']:>6.2f} {r['failures']:>4}")
    print("\n".join(lines))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"latency_ms": args.latency_ms, "cores": os.cpu_count(), "rows": rows}, indent=2))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
