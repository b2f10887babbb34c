"""What morphguard adds to a request, against calling the upstream directly and against the LiteLLM proxy.

One fixed-latency OpenAI-compatible upstream runs on loopback (benchmarks/fixed_upstream.py). In the same
run, the same RAG chat request goes at concurrency 1, 16 and 64 to: the upstream directly; morphguard with
checks off (no context source enabled: the request is forwarded and audited, nothing is checked); the same
without the audit trail (what the audit row costs); morphguard in async mode (the check queued and run in
the background, the fixed upstream serving as judge); morphguard with checks off as 2 processes
(`serve --workers 2`); the LiteLLM proxy as a plain pass-through (skipped without `litellm[proxy]`:
`pip install -e '.[bench]'`); and the floor under any proxy on this stack, uvicorn and aiohttp forwarding bytes
with nothing else (benchmarks/bare_forwarder.py).

Where the machine has two cores or more, the load generator and the upstream run on the first and every
single-process proxy on the second, so a proxy's throughput is its own; the 2-process proxy gets every core
(shared with the load generator). CPU per request is the proxy's own (its processes' user + system time
over the requests sent). Then streaming: the same request with `stream: true`, sent one at a time,
direct and through morphguard (checks off, passthrough) in turn: time to the first body byte, and the time
the rest of the stream takes, per chunk. Prints tables, writes benchmarks/results/proxy_overhead.json and
a plot, benchmarks/results/proxy_overhead.png.

    python benchmarks/proxy_overhead.py [--latency-ms 0] [--requests 2000] [--concurrency 1,16,64]

A/B mode, so that a slower change shows before it lands: `--baseline-ref REF` serves this tree and REF's
(unpacked with `git archive` into a temporary folder, run under its own PYTHONPATH) side by side, checks off
with and without the audit trail, and measures them in alternating rounds; it prints each one's added
latency, throughput and CPU per request, the audit row's cost in each, and the ratios
(benchmarks/results/proxy_overhead_ab.json).

    python benchmarks/proxy_overhead.py --baseline-ref e672b5b [--rounds 6] [--requests 800] [--concurrency 1,16]
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

import aiohttp
import httpx
import yaml

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no remote cost-map fetch, here or in children
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from fixed_upstream import STREAM_CHUNKS  # noqa: E402

BODY = {
    "model": "bench",
    "messages": [{"role": "user", "content": "<context>The Eiffel Tower is in Paris, France.</context>\n"
                                             "Where is the Eiffel Tower?"}],
}
HEADERS = {"Authorization": "Bearer sk-bench", "Content-Type": "application/json"}
PAYLOAD = json.dumps(BODY).encode()
STREAM_PAYLOAD = json.dumps({**BODY, "stream": True}).encode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def process(cmd: list[str], ready_url: str, log: Path, env: dict[str, str] | None = None,
            timeout: float = 120, cwd: Path = ROOT) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
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
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of `pid` and every live process below it."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        child = int(stat.parent.name)
        parents[child] = int(fields[1])
        times[child] = (int(fields[11]) + int(fields[12])) / tick
    total, frontier = 0.0, [pid]
    while frontier:
        current = frontier.pop()
        total += times.get(current, 0.0)
        frontier += [c for c, p in parents.items() if p == current]
    return total


def pinned(cores: list[int] | None, cmd: list[str]) -> list[str]:
    return ["taskset", "-c", ",".join(map(str, cores)), *cmd] if cores else cmd


def morphguard(folder: Path, upstream: str, name: str, processes: int = 1, audit: bool = True,
               **proxy: object) -> tuple[list[str], str, Path]:
    """The command that serves morphguard with checks as `proxy` says, its base URL and its log."""
    port = free_port()
    config = {
        "judge": {"model": "openai/bench", "api_base": upstream, "api_key": "sk-bench"},
        "detector": {"name": "metarag"},
        "metarag": {"profile": "paper"},
        "proxy": {"upstream": {"base_url": upstream}, **proxy},  # the client's key is forwarded
        "policy": {"audit": {"path": str(folder / f"{name}.db"), "enabled": audit}},
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    cmd = [sys.executable, "-m", "morphguard.cli", "serve", "--config", str(path), "--port", str(port),
           "--workers", str(processes)]
    return cmd, f"http://127.0.0.1:{port}", folder / f"{name}.log"


def bare_forwarder(folder: Path, upstream: str) -> tuple[list[str], str, Path]:
    """The floor: the same server and client libraries forwarding bytes, nothing else (benchmarks/bare_forwarder.py)."""
    port = free_port()
    return ([sys.executable, str(HERE / "bare_forwarder.py"), str(port), upstream], f"http://127.0.0.1:{port}",
            folder / "bare.log")


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


async def load(base_url: str, concurrency: int, requests: int, pid: int) -> dict[str, float]:
    """`requests` chat completions, `concurrency` at a time: latency percentiles (ms), requests/s, and the
    CPU ms the target's processes spent per request."""
    latencies: list[float] = []
    failures = 0
    queue = iter(range(requests))
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(base_url, connector=connector, headers=HEADERS) as client:
        async def worker(requests: Iterator[int], record: bool) -> None:
            nonlocal failures
            for _ in requests:
                started = time.perf_counter()
                async with client.post("/v1/chat/completions", data=PAYLOAD) as response:
                    await response.read()
                    failures += record and response.status != 200
                if record:
                    latencies.append((time.perf_counter() - started) * 1000)

        # Warm-up at the same concurrency: every hop's connection pool grows to its size before the clock
        # runs (the first burst of new connections through a proxy stalled ~200 ms here).
        warm_up = iter(range(max(50, 4 * concurrency)))
        await asyncio.gather(*(worker(warm_up, False) for _ in range(concurrency)))
        cpu, started = cpu_seconds(pid), time.perf_counter()
        await asyncio.gather(*(worker(queue, True) for _ in range(concurrency)))
        wall = time.perf_counter() - started
        cpu = cpu_seconds(pid) - cpu
    q = statistics.quantiles(latencies, n=100, method="inclusive")
    return {"p50": statistics.median(latencies), "p95": q[94], "p99": q[98], "rps": len(latencies) / wall,
            "cpu_ms": cpu * 1000 / len(latencies), "failures": failures, "requests": len(latencies)}


async def streams(bases: dict[str, str], requests: int) -> dict[str, dict[str, float]]:
    """Streamed requests to each base in turn: median time to the first body byte and the rest per chunk."""
    first: dict[str, list[float]] = {name: [] for name in bases}
    rest: dict[str, list[float]] = {name: [] for name in bases}
    async with aiohttp.ClientSession(headers=HEADERS) as client:
        for n in range(requests + 20):
            for name, base in bases.items():
                started = time.perf_counter()
                async with client.post(base + "/v1/chat/completions", data=STREAM_PAYLOAD) as response:
                    parts = response.content.iter_any()
                    await parts.__anext__()
                    got_first = time.perf_counter()
                    async for _ in parts:
                        pass
                ended = time.perf_counter()
                if n >= 20:  # the first 20: warm-up
                    first[name].append((got_first - started) * 1000)
                    rest[name].append((ended - got_first) * 1000)
    return {name: {"ttfb_p50": statistics.median(first[name]), "rest_p50": statistics.median(rest[name]),
                   "requests": requests} for name in bases}


def plot(rows: list[dict[str, object]], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no plot: matplotlib is not installed", file=sys.stderr)
        return
    targets = list(dict.fromkeys(str(r["target"]) for r in rows if r["target"] != "direct"))
    levels = sorted({int(r["concurrency"]) for r in rows if int(r["concurrency"]) > 1})  # type: ignore[call-overload]
    figure, (added, throughput) = plt.subplots(1, 2, figsize=(12, 4.2))
    at_one = {r["target"]: r for r in rows if r["concurrency"] == 1}
    added.barh(targets, [float(at_one[t]["added_p50_ms"]) for t in targets], color="#4c72b0")  # type: ignore[arg-type]
    added.set_xlabel("added median latency at concurrency 1 (ms)")
    added.invert_yaxis()
    width = 0.8 / max(1, len(levels))
    for i, level in enumerate(levels):
        by_target = {r["target"]: r for r in rows if r["concurrency"] == level}
        throughput.barh([y + i * width for y in range(len(targets))],
                        [float(by_target[t]["rps"]) for t in targets], height=width,  # type: ignore[arg-type]
                        label=f"concurrency {level}")
    throughput.set_yticks([y + width * (len(levels) - 1) / 2 for y in range(len(targets))], targets)
    throughput.invert_yaxis()
    throughput.set_xlabel("requests per second")
    throughput.legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def release_tree(ref: str, folder: Path) -> Path:
    """The source tree of `ref` in this repository, unpacked into `folder` (git archive: nothing is checked out
    here, and nothing is left behind in the repository)."""
    tree = folder / "baseline"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", ref], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def ab(args: argparse.Namespace, levels: list[int], near: list[int] | None, far: list[int] | None) -> None:
    """This tree against `--baseline-ref` in the same run: checks off with and without the audit trail, for
    each, in alternating rounds (A B B A ...), each round beside a direct measurement of the upstream.
    Medians over the rounds; the audit row's cost is a round's `checks off` minus its `no audit`; the ratios
    are each round's candidate over its baseline, their median."""
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        folder = Path(tmp)
        trees = {"candidate": ROOT, "baseline": release_tree(args.baseline_ref, folder)}
        port = free_port()
        upstream = f"http://127.0.0.1:{port}/v1"
        started = stack.enter_context(process(
            pinned(near, [sys.executable, str(HERE / "fixed_upstream.py"), str(port), str(args.latency_ms)]),
            f"{upstream}/models", folder / "upstream.log"))
        bases: dict[str, tuple[str, int]] = {"direct": (upstream.removesuffix("/v1"), started.pid)}
        for who, tree in trees.items():
            for name, audit in (("checks off", True), ("no audit", False)):
                label = f"{who}, {name}"
                cmd, base, log = morphguard(folder, upstream, label.replace(", ", "-").replace(" ", "_"),
                                            audit=audit, context={"sources": []})
                proc = stack.enter_context(process(pinned(far, cmd), f"{base}/healthz", log, timeout=180, cwd=tree,
                                                   env={"PYTHONPATH": str(tree)}))
                bases[label] = (base, proc.pid)
        names = [n for n in bases if n != "direct"]
        measured: dict[tuple[str, int], list[dict[str, float]]] = {}
        for concurrency in levels:
            requests = args.requests if concurrency > 1 else max(200, args.requests // 4)
            for round_ in range(args.rounds):
                order = ["direct", *(names if round_ % 2 == 0 else reversed(names))]
                print(f"… concurrency {concurrency}, round {round_ + 1}/{args.rounds}", file=sys.stderr)
                for name in order:
                    base, pid = bases[name]
                    measured.setdefault((name, concurrency), []).append(asyncio.run(load(base, concurrency,
                                                                                        requests, pid)))
    lines = [f"A/B: this tree against {args.baseline_ref}, upstream fixed at {args.latency_ms:.0f} ms, "
             f"{args.rounds} alternating rounds, {platform.node()} ({os.cpu_count()} cores, "
             f"proxies on core {far[0] if far else '-'}), medians over the rounds"]
    summary: list[dict[str, object]] = []
    for concurrency in levels:
        direct = measured[("direct", concurrency)]
        header = f"{'concurrency ' + str(concurrency):<32} {'p50 ms':>7} {'+p50 ms':>8} {'req/s':>7} {'CPU ms/req':>10}"
        lines += ["", header, "-" * len(header)]
        for name in ["direct", *names]:
            runs = measured[(name, concurrency)]
            row = {"target": name, "concurrency": concurrency, "requests": int(runs[0]["requests"]),
                   "rounds": len(runs), "p50": statistics.median(r["p50"] for r in runs),
                   "added_p50_ms": statistics.median(r["p50"] - d["p50"] for r, d in zip(runs, direct, strict=True)),
                   "rps": statistics.median(r["rps"] for r in runs),
                   "cpu_ms": statistics.median(r["cpu_ms"] for r in runs),
                   "failures": sum(r["failures"] for r in runs)}
            summary.append(row)
            lines.append(f"{name:<32} {row['p50']:>7.3f} {row['added_p50_ms']:>8.3f} {row['rps']:>7.0f} "
                         f"{row['cpu_ms']:>10.3f}")
        audit_row = {who: statistics.median(o["p50"] - b["p50"] for o, b in zip(
            measured[(f"{who}, checks off", concurrency)], measured[(f"{who}, no audit", concurrency)], strict=True))
            for who in trees}
        # Ratios round by round (candidate and baseline measured minutes apart at most), then their median.
        rounds = list(zip(direct, measured[("candidate, checks off", concurrency)],
                          measured[("baseline, checks off", concurrency)], strict=True))
        ratio = {"added_p50_ms": statistics.median((c["p50"] - d["p50"]) / (b["p50"] - d["p50"]) for d, c, b in rounds),
                 "rps": statistics.median(c["rps"] / b["rps"] for _, c, b in rounds),
                 "cpu_ms": statistics.median(c["cpu_ms"] / b["cpu_ms"] for _, c, b in rounds)}
        lines += [f"audit row (checks off minus no audit, p50): candidate {audit_row['candidate']:.3f} ms, "
                  f"baseline {audit_row['baseline']:.3f} ms",
                  f"candidate / baseline, checks off, median of the rounds' ratios: added p50 "
                  f"x{ratio['added_p50_ms']:.2f}, req/s x{ratio['rps']:.2f}, CPU per request x{ratio['cpu_ms']:.2f}"]
        summary.append({"concurrency": concurrency, "audit_row_p50_ms": audit_row, "candidate_over_baseline": ratio,
                        "rounds": {name: measured[(name, concurrency)] for name in ["direct", *names]}})
    print("\n".join(lines))
    out = args.out.with_name(args.out.stem + "_ab.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"baseline_ref": args.baseline_ref, "latency_ms": args.latency_ms,
                               "rounds": args.rounds, "summary": summary}, indent=2))
    print(f"wrote {out}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latency-ms", type=float, default=0.0, help="the upstream's fixed delay")
    parser.add_argument("--requests", type=int, default=2000, help="requests per target and concurrency")
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--stream-requests", type=int, default=300)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "proxy_overhead.json")
    parser.add_argument("--baseline-ref", help="A/B mode: this tree against that git ref (e.g. the last release), "
                                               "checks off with and without the audit trail, in alternating rounds")
    parser.add_argument("--rounds", type=int, default=6, help="A/B mode: rounds per concurrency")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    cores = sorted(os.sched_getaffinity(0))
    near, far = ([cores[0]], cores[1:2]) if len(cores) > 1 else (None, None)
    if near:
        os.sched_setaffinity(0, near)  # the load generator beside the upstream, away from the proxies
    if args.baseline_ref:
        ab(args, levels, near, far)
        return

    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        folder = Path(tmp)
        port = free_port()
        upstream = f"http://127.0.0.1:{port}/v1"
        started = stack.enter_context(process(
            pinned(near, [sys.executable, str(HERE / "fixed_upstream.py"), str(port), str(args.latency_ms)]),
            f"{upstream}/models", folder / "upstream.log"))
        targets: dict[str, tuple[tuple[list[str], str, Path] | None, list[int] | None]] = {
            "morphguard, checks off": (morphguard(folder, upstream, "off", context={"sources": []}), far),
            "morphguard, checks off, no audit": (morphguard(folder, upstream, "bare", audit=False,
                                                              context={"sources": []}), far),
            "morphguard, async checks": (morphguard(folder, upstream, "async", mode="async"), far),
            "morphguard, checks off, 2 processes": (morphguard(folder, upstream, "off2", processes=2,
                                                                 context={"sources": []}), None),
            "litellm proxy": (litellm_proxy(folder, upstream), far),
            "floor: uvicorn + aiohttp, nothing else": (bare_forwarder(folder, upstream), far),
        }
        bases = {"direct": (upstream.removesuffix("/v1"), started.pid)}
        for name, (spec, where) in targets.items():
            if spec is None:
                print(f"skipped {name}: litellm[proxy] is not installed (pip install -e '.[bench]')", file=sys.stderr)
                continue
            cmd, base, log = spec
            ready = f"{base}/v1/models" if name.startswith("litellm") else f"{base}/healthz"
            proc = stack.enter_context(process(pinned(where, cmd), ready, log, timeout=180))
            bases[name] = (base, proc.pid)
        for concurrency in levels:
            requests = args.requests if concurrency > 1 else max(200, args.requests // 4)
            for name, (base, pid) in bases.items():
                print(f"… {name} at concurrency {concurrency}", file=sys.stderr)
                measured = asyncio.run(load(base, concurrency, requests, pid))
                rows.append({"target": name, "concurrency": concurrency, **measured})
        print("… streaming", file=sys.stderr)
        streamed = asyncio.run(streams({"direct": bases["direct"][0],
                                        "morphguard, checks off": bases["morphguard, checks off"][0]},
                                       args.stream_requests))

    direct = {r["concurrency"]: r for r in rows if r["target"] == "direct"}
    layout = f", load generator and upstream on core {near[0]}, proxies on core {far[0]}" if near and far else ""
    header = (f"{'target':<36} {'conc':>4} {'p50 ms':>7} {'p99 ms':>7} {'req/s':>7} {'+p50 ms':>8} "
              f"{'CPU ms/req':>10} {'fail':>4}")
    lines = [f"proxy overhead: upstream fixed at {args.latency_ms:.0f} ms, {platform.node()} ({len(cores)} cores"
             f"{layout}), "
             f"Python {platform.python_version()}", header, "-" * len(header)]
    for r in rows:
        r["added_p50_ms"] = r["p50"] - direct[r["concurrency"]]["p50"]  # type: ignore[operator]
        lines.append(f"{r['target']:<36} {r['concurrency']:>4} {r['p50']:>7.2f} {r['p99']:>7.2f} {r['rps']:>7.0f} "
                     f"{r['added_p50_ms']:>8.2f} {r['cpu_ms']:>10.2f} {r['failures']:>4}")
    base = streamed["direct"]
    ours = streamed["morphguard, checks off"]
    lines += ["", f"streaming ({args.stream_requests} requests each, one at a time, "
                  f"{STREAM_CHUNKS} chunks + [DONE], passthrough, checks off)",
              f"{'target':<36} {'TTFB p50 ms':>12} {'rest p50 ms':>12}"]
    for name, s in streamed.items():
        lines.append(f"{name:<36} {s['ttfb_p50']:>12.3f} {s['rest_p50']:>12.3f}")
    added_total = ours["ttfb_p50"] + ours["rest_p50"] - base["ttfb_p50"] - base["rest_p50"]
    lines.append(f"added: TTFB {ours['ttfb_p50'] - base['ttfb_p50']:.3f} ms, whole stream {added_total:.3f} ms "
                 f"(after the first byte: {(ours['rest_p50'] - base['rest_p50']) * 1000 / STREAM_CHUNKS:.1f} µs "
                 "per chunk)")
    print("\n".join(lines))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"latency_ms": args.latency_ms, "cores": len(cores), "pinned": bool(near and far),
                                    "rows": rows, "streaming": streamed, "stream_chunks": STREAM_CHUNKS}, indent=2))
    plot(rows, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}", file=sys.stderr)

if __name__ == "__main__":
    main()
