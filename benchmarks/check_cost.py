"""What a check costs a worker process as traffic and answers grow.

One morphguard process (`serve`, one worker, pinned to the last core where there are two) checks through
`POST /v1/check`; a loopback OpenAI-compatible server stands in for the judge (benchmarks/fixed_upstream.py),
answering every call after a fixed delay. Three measurements:

(a) throughput: RAGTruth QA items (question, context, answer; `--data-dir`) checked by `sentences` and by `combined`
    with `--judge-ms` (400) per judge call, at 1, 8, 64 and 256 checks in flight, each level for `--seconds`:
    checks per second, median time per check, and the process's CPU per check. `judge.concurrency` is raised to
    the number in flight (its default, 8, allows 8 calls at once: 20 calls a second at 400 ms).
(b) CPU per check against size, with an instant judge: answers of 10 to 5,000 sentences (RAGTruth answers' sentences,
    one 4 KB context), and contexts of 1 KB to 4 MB (RAGTruth passages, a 10-sentence answer); the caps on judge calls
    and text are lifted. The log-log slope of CPU against size is printed (1: linear, 2: quadratic), over every size
    and over the largest three (past a check's fixed cost).
(c) memory: the process's resident size while 16, 64 and 256 streamed chat completions are in flight, each checked as
    it flows (`stream_mode: incremental`, `sentences`, the judge at `--judge-ms`); the slope of resident size
    against streams in flight is the memory one stream holds.

Prints tables, writes benchmarks/results/check_cost.json and benchmarks/results/check_cost.png. Bounded: a few
minutes with the defaults; run it niced on a shared machine.

    nice -n 10 python benchmarks/check_cost.py --data-dir /work/shared/data [--seconds 8] [--judge-ms 400]

A/B mode, for a change meant to cut a check's CPU: `--baseline-ref REF` serves (a) from this tree and from REF's
(unpacked with git archive) side by side, each level of checks in flight measured on both in alternating rounds
(A B, B A, ...), and prints both with the per-round ratios' medians; nothing else is measured, and the results go
to benchmarks/results/check_cost_ab.json (no plot).

    nice -n 10 python benchmarks/check_cost.py --data-dir /work/shared/data --baseline-ref main --rounds 3 \
        --in-flight 64,256
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import platform
import re
import statistics
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import aiohttp
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proxy_overhead import HERE, ROOT, cpu_seconds, free_port, morphguard, pinned, process, release_tree  # noqa: E402

HEADERS = {"Authorization": "Bearer sk-bench", "Content-Type": "application/json"}
IN_FLIGHT = (1, 8, 64, 256)
SENTENCES = (10, 50, 250, 1000, 5000)
CONTEXT_BYTES = (1_000, 16_000, 256_000, 1_000_000, 4_000_000)
STREAMS = (16, 64, 256)


def ragtruth_qa(data_dir: Path) -> list[dict[str, Any]]:
    path = data_dir / "ragtruth" / "test_qa.jsonl"
    items = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [{"question": i["question"], "context": i["context"], "answer": i["answer"]} for i in items
            if i.get("answer") and i.get("context")]


def sentences_of(items: list[dict[str, Any]]) -> list[str]:
    found = []
    for item in items:
        found += [s.strip() for s in re.split(r"(?<=[.!?])\s+", item["answer"]) if len(s.strip()) > 20]
    return found


def passages_of(items: list[dict[str, Any]]) -> str:
    return "\n".join(dict.fromkeys(item["context"] for item in items))


def take(text: str, size: int) -> str:
    """`size` characters of `text`, repeated as needed."""
    return (text * (size // len(text) + 1))[:size]


def serve(stack: ExitStack, folder: Path, judge_url: str, name: str, check: str, cores: list[int] | None,
          tree: Path = ROOT, **extra: Any) -> tuple[str, int]:
    """A morphguard process of the source `tree` whose judge is at `judge_url`, checking with the detector
    `check`; its base URL and pid. `extra`: config sections, merged into the defaults."""
    cmd, base, log = morphguard(folder, judge_url, name)
    config_path = Path(cmd[cmd.index("--config") + 1])
    config = yaml.safe_load(config_path.read_text())
    config["detector"] = {"name": check, **extra.pop("detector", {})}
    config["judge"].update({"cache": {"enabled": False}, **extra.pop("judge", {})})
    config["proxy"].update({"keys": ["sk-bench"], **extra.pop("proxy", {})})
    config.update(extra)
    config_path.write_text(yaml.safe_dump(config))
    proc = stack.enter_context(process(pinned(cores, cmd), base + "/healthz", log, timeout=240, cwd=tree,
                                       env={"PYTHONPATH": str(tree)}))
    return base, proc.pid


async def throughput(base: str, pid: int, items: list[dict[str, Any]], in_flight: int,
                     seconds: float) -> dict[str, float]:
    """Checks `in_flight` at a time for `seconds` (after one round of warm-up): checks/s, median s, CPU ms/check."""
    counter = itertools.count()
    times: list[float] = []
    reasons: dict[str, int] = {}
    connector = aiohttp.TCPConnector(limit=in_flight)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(base, connector=connector, headers=HEADERS, timeout=timeout) as client:
        async def one(record: bool) -> None:
            n = next(counter)
            item = items[n % len(items)]
            body = {**item, "question": f"{item['question']} ({n})"}  # no two alike: no cache answers
            started = time.perf_counter()
            async with client.post("/v1/check", json=body) as response:
                reply = await response.json()
                if response.status != 200:
                    raise RuntimeError(f"/v1/check answered {response.status}: {reply}")
            if record:
                times.append(time.perf_counter() - started)
                reason = str(reply.get("reason") or ("checked" if reply.get("checked") else reply.get("error")))
                reasons[reason] = reasons.get(reason, 0) + 1

        await asyncio.gather(*(one(False) for _ in range(in_flight)))
        deadline = time.monotonic() + seconds

        async def loop() -> None:
            while time.monotonic() < deadline:
                await one(True)

        cpu, started = cpu_seconds(pid), time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(in_flight)))
        wall, cpu = time.perf_counter() - started, cpu_seconds(pid) - cpu
    return {"in_flight": in_flight, "checks": len(times), "checks_per_s": len(times) / wall,
            "median_s": statistics.median(times), "cpu_ms_per_check": cpu * 1000 / len(times), "reasons": reasons}


async def cpu_per_check(base: str, pid: int, body: dict[str, Any], min_cpu_s: float = 0.3,
                        most: int = 5) -> dict[str, Any]:
    """One check repeated (a new question each time) until `min_cpu_s` of CPU or `most` checks: CPU ms per check."""
    timeout = aiohttp.ClientTimeout(total=900)
    async with aiohttp.ClientSession(base, headers=HEADERS, timeout=timeout) as client:
        done, cpu, reasons = 0, 0.0, set()
        while done < most and (cpu < min_cpu_s or done == 0):
            before = cpu_seconds(pid)
            async with client.post("/v1/check", json={**body, "question": f"{body['question']} ({done})"}) as reply:
                answer = await reply.json()
                if reply.status != 200:
                    raise RuntimeError(f"/v1/check answered {reply.status}: {answer}")
            cpu += cpu_seconds(pid) - before
            reasons.add(str(answer.get("reason") or ("checked" if answer.get("checked") else answer)))
            done += 1
    return {"cpu_ms": cpu * 1000 / done, "checks": done, "reasons": sorted(reasons)}


def slope(xs: list[float], ys: list[float]) -> float:
    fit = statistics.linear_regression([math.log(x) for x in xs], [math.log(max(y, 1e-6)) for y in ys])
    return float(fit.slope)


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def streams_in_flight(base: str, pid: int, streams: int, seconds: float) -> dict[str, float]:
    """`streams` streamed completions kept in flight for `seconds`: the median resident size meanwhile."""
    body = {"model": "bench", "stream": True, "messages": [{"role": "user", "content": (
        "<context>The Eiffel Tower is in Paris, France. It was finished in 1889.</context>\n"
        "Where is the Eiffel Tower?")}]}
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.05):
            samples.append(rss_kb(pid))

    finished = 0
    connector = aiohttp.TCPConnector(limit=streams)
    async with aiohttp.ClientSession(base, connector=connector, headers=HEADERS) as client:
        deadline = time.monotonic() + seconds

        async def loop() -> None:
            nonlocal finished
            while time.monotonic() < deadline:
                async with client.post("/v1/chat/completions", json=body) as response:
                    if response.status != 200:
                        raise RuntimeError(f"stream answered {response.status}: {await response.text()}")
                    async for _ in response.content.iter_any():
                        pass
                finished += 1

        sampler = threading.Thread(target=sample)
        sampler.start()
        await asyncio.gather(*(loop() for _ in range(streams)))
        stop.set()
        sampler.join()
    steady = samples[len(samples) // 4:] or samples  # after the first quarter: all streams under way
    return {"streams": streams, "rss_kb": statistics.median(steady), "finished": finished}


def plot(result: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no plot: matplotlib is not installed", file=sys.stderr)
        return
    figure, (rate, size, memory) = plt.subplots(1, 3, figsize=(15, 4.2))
    for detector, rows in result["throughput"].items():
        rate.plot([r["in_flight"] for r in rows], [r["checks_per_s"] for r in rows], marker="o", label=detector)
    rate.set_xscale("log")
    rate.set_xlabel("checks in flight")
    rate.set_ylabel("checks per second, one process")
    rate.set_title(f"RAGTruth QA, judge {result['judge_ms']:.0f} ms per call")
    rate.legend()
    for detector, rows in result["cpu_by_size"].items():
        for axis, marker in (("sentences", "o"), ("context_bytes", "s")):
            points = [r for r in rows if r["axis"] == axis]
            if points:
                size.plot([r["size"] for r in points], [r["cpu_ms"] for r in points], marker=marker,
                          label=f"{detector}: {axis.replace('_', ' ')} (slope {result['slopes'][detector][axis]:.2f})")
    size.set_xscale("log")
    size.set_yscale("log")
    size.set_xlabel("answer sentences / context bytes")
    size.set_ylabel("CPU ms per check")
    size.legend(fontsize=8)
    rows = result["memory"]["levels"]
    memory.plot([r["streams"] for r in rows], [r["rss_kb"] / 1024 for r in rows], marker="o")
    memory.set_xlabel("streams in flight (incremental, sentences)")
    memory.set_ylabel("resident MB")
    memory.set_title(f"{result['memory']['kb_per_stream']:.0f} KB per stream")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def ab(args: argparse.Namespace, items: list[dict[str, Any]], detectors: list[str], levels: list[int],
       near: list[int] | None, far: list[int] | None) -> None:
    """(a) for this tree and `--baseline-ref`'s, side by side, in alternating rounds; medians over the rounds, and
    the median of each round's candidate over baseline."""
    measured: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        folder = Path(tmp)
        trees = {"candidate": ROOT, "baseline": release_tree(args.baseline_ref, folder)}
        port = free_port()
        judge = f"http://127.0.0.1:{port}/v1"
        stack.enter_context(process(pinned(near, [sys.executable, str(HERE / "fixed_upstream.py"), str(port),
                                                  str(args.judge_ms)]), judge + "/models", folder / "judge.log"))
        servers = {(who, detector): serve(stack, folder, judge, f"{who}-{detector}", detector, far, tree,
                                          judge={"concurrency": 4 * max(levels)})
                   for who, tree in trees.items() for detector in detectors}
        for round_ in range(args.rounds):
            for detector in detectors:
                for in_flight in levels:
                    for who in (trees if round_ % 2 == 0 else list(trees)[::-1]):
                        print(f"… round {round_ + 1}/{args.rounds}: {detector}, {in_flight} in flight, {who}",
                              file=sys.stderr)
                        base, pid = servers[(who, detector)]
                        row = asyncio.run(throughput(base, pid, items, in_flight, args.seconds))
                        measured.setdefault((who, detector, in_flight), []).append(row)
    lines = [f"A/B: this tree against {args.baseline_ref}, judge {args.judge_ms:.0f} ms per call, {args.rounds} "
             f"alternating rounds of {args.seconds:g} s, {platform.node()} ({os.cpu_count()} cores, shared), "
             "medians over the rounds", "",
             f"{'detector':<10} {'in flight':>9} {'tree':<10} {'checks/s':>9} {'CPU ms/check':>13} {'median s':>9}"]
    summary = []
    for detector in detectors:
        for in_flight in levels:
            for who in ("baseline", "candidate"):
                runs = measured[(who, detector, in_flight)]
                row = {"detector": detector, "in_flight": in_flight, "tree": who, "rounds": len(runs),
                       "checks_per_s": statistics.median(r["checks_per_s"] for r in runs),
                       "cpu_ms_per_check": statistics.median(r["cpu_ms_per_check"] for r in runs),
                       "median_s": statistics.median(r["median_s"] for r in runs), "runs": runs}
                summary.append(row)
                lines.append(f"{detector:<10} {in_flight:>9} {who:<10} {row['checks_per_s']:>9.1f} "
                             f"{row['cpu_ms_per_check']:>13.2f} {row['median_s']:>9.3f}")
            pairs = list(zip(measured[("candidate", detector, in_flight)], measured[("baseline", detector, in_flight)],
                             strict=True))
            rate = statistics.median(c["checks_per_s"] / b["checks_per_s"] for c, b in pairs)
            cpu = statistics.median(c["cpu_ms_per_check"] / b["cpu_ms_per_check"] for c, b in pairs)
            lines.append(f"{detector:<10} {in_flight:>9} {'ratio':<10} {rate:>9.3f} {cpu:>13.3f}")
    print("\n".join(lines))
    out = args.out.with_name("check_cost_ab.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"baseline_ref": args.baseline_ref, "judge_ms": args.judge_ms, "rounds": args.rounds,
                               "seconds": args.seconds, "host": platform.node(), "rows": summary}, indent=2) + "\n")
    print(f"wrote {out}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--judge-ms", type=float, default=400.0)
    parser.add_argument("--seconds", type=float, default=8.0, help="per level of checks in flight")
    parser.add_argument("--detectors", default="sentences,combined")
    parser.add_argument("--max-cpu-s", type=float, default=30.0,
                        help="(b): a size whose check took more CPU than this ends that axis")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "check_cost.json")
    parser.add_argument("--baseline-ref", help="A/B mode: (a) for this tree and this git ref's, alternating")
    parser.add_argument("--rounds", type=int, default=3, help="A/B mode: rounds")
    parser.add_argument("--in-flight", default=",".join(map(str, IN_FLIGHT)), help="A/B mode: levels of (a)")
    args = parser.parse_args()
    detectors = args.detectors.split(",")
    items = ragtruth_qa(args.data_dir)
    cores = sorted(os.sched_getaffinity(0))
    near, far = ([cores[0]], cores[-1:]) if len(cores) > 1 else (None, None)
    if near:
        os.sched_setaffinity(0, near)  # the load generator and the judge away from the worker
    if args.baseline_ref:
        ab(args, items, detectors, [int(n) for n in args.in_flight.split(",")], near, far)
        return
    result: dict[str, Any] = {"judge_ms": args.judge_ms, "items": len(items), "host": platform.node(),
                              "cores": len(cores), "throughput": {}, "cpu_by_size": {}, "slopes": {}}
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        folder = Path(tmp)
        judges = {}
        for name, ms in (("slow", args.judge_ms), ("instant", 0.0)):
            port = free_port()
            judges[name] = f"http://127.0.0.1:{port}/v1"
            stack.enter_context(process(pinned(near, [sys.executable, str(HERE / "fixed_upstream.py"), str(port),
                                                      str(ms)]), judges[name] + "/models", folder / f"{name}.log"))
        for detector in detectors:
            base, pid = serve(stack, folder, judges["slow"], f"rate-{detector}", detector, far,
                              judge={"concurrency": 4 * max(IN_FLIGHT)})
            rows = []
            for in_flight in IN_FLIGHT:
                print(f"… (a) {detector}, {in_flight} in flight", file=sys.stderr)
                rows.append(asyncio.run(throughput(base, pid, items, in_flight, args.seconds)))
                print(f"  {rows[-1]}", file=sys.stderr)
            result["throughput"][detector] = rows
        answers, passages = sentences_of(items), passages_of(items)
        for detector in detectors:
            base, pid = serve(stack, folder, judges["instant"], f"size-{detector}", detector, far,
                              detector={"max_judge_calls": None, "max_text_chars": None},
                              proxy={"max_body_bytes": 64_000_000})
            rows = []
            for axis, sizes in (("sentences", SENTENCES), ("context_bytes", CONTEXT_BYTES)):
                for size in sizes:
                    print(f"… (b) {detector}, {axis} {size}", file=sys.stderr)
                    n = size if axis == "sentences" else 10
                    answer = " ".join(itertools.islice(itertools.cycle(answers), n))
                    context = take(passages, size if axis == "context_bytes" else 4_000)
                    measured = asyncio.run(cpu_per_check(base, pid, {"question": items[0]["question"],
                                                                     "context": context, "answer": answer}))
                    rows.append({"axis": axis, "size": size, **measured})
                    print(f"  {rows[-1]}", file=sys.stderr)
                    if measured["cpu_ms"] > args.max_cpu_s * 1000:
                        break
            result["cpu_by_size"][detector] = rows
            slopes: dict[str, float] = {}
            for axis in ("sentences", "context_bytes"):
                points = [r for r in rows if r["axis"] == axis]
                slopes[axis] = slope([r["size"] for r in points], [r["cpu_ms"] for r in points])
                # the growth where the text dominates, past a check's fixed cost
                largest = points[-3:]
                slopes[f"{axis}_largest_3"] = slope([r["size"] for r in largest], [r["cpu_ms"] for r in largest])
            result["slopes"][detector] = slopes
        base, pid = serve(stack, folder, judges["slow"], "streams", "sentences", far,
                          judge={"concurrency": 4 * max(STREAMS)},
                          proxy={"stream_mode": "incremental", "upstream": {"base_url": judges["slow"]}})
        idle = rss_kb(pid)
        levels = []
        for streams in STREAMS:
            print(f"… (c) {streams} streams in flight", file=sys.stderr)
            levels.append(asyncio.run(streams_in_flight(base, pid, streams, args.seconds)))
        per_stream = statistics.linear_regression([r["streams"] for r in levels], [r["rss_kb"] for r in levels]).slope
        result["memory"] = {"idle_rss_kb": idle, "levels": levels, "kb_per_stream": per_stream}

    lines = [f"check cost: one worker process, judge {args.judge_ms:.0f} ms per call, {result['cores']} cores "
             f"(shared), {platform.node()}", "",
             "(a) RAGTruth QA checks", f"{'detector':<10} {'in flight':>9} {'checks':>7} {'checks/s':>9} "
             f"{'median s':>9} {'CPU ms/check':>13}  reasons"]
    for detector, rows in result["throughput"].items():
        for r in rows:
            lines.append(f"{detector:<10} {r['in_flight']:>9} {r['checks']:>7} {r['checks_per_s']:>9.1f} "
                         f"{r['median_s']:>9.3f} {r['cpu_ms_per_check']:>13.1f}  {r['reasons']}")
    lines += ["", "(b) CPU per check against size (judge instant; caps lifted)",
              f"{'detector':<10} {'axis':<14} {'size':>9} {'CPU ms':>10} {'n':>3}  reasons"]
    for detector, rows in result["cpu_by_size"].items():
        for r in rows:
            lines.append(f"{detector:<10} {r['axis']:<14} {r['size']:>9} {r['cpu_ms']:>10.1f} {r['checks']:>3}  "
                         f"{r['reasons']}")
        s = result["slopes"][detector]
        lines.append(f"{detector:<10} log-log slope of CPU: {s['sentences']:.2f} against sentences "
                     f"({s['sentences_largest_3']:.2f} over the largest three), {s['context_bytes']:.2f} against "
                     f"context bytes ({s['context_bytes_largest_3']:.2f} over the largest three)")
    memory = result["memory"]
    lines += ["", "(c) resident size with streams in flight (incremental, sentences)",
              f"idle {memory['idle_rss_kb'] / 1024:.0f} MB; " + ", ".join(
                  f"{r['streams']} streams {r['rss_kb'] / 1024:.0f} MB" for r in memory["levels"]),
              f"slope: {memory['kb_per_stream']:.0f} KB per stream in flight"]
    print("\n".join(lines))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    plot(result, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}", file=sys.stderr)


if __name__ == "__main__":
    main()
