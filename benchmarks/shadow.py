"""What a shadow candidate costs the live response: the same checked RAG requests through two proxies, one without
a shadow and one whose shadow checks every request (`shadow.sample: 1`) with a judge of its own as slow as the live
one.

A fixed-latency server (benchmarks/fixed_upstream.py, `--judge-ms`) is both the upstream and the judge; both proxies
run `sentences` (one judge call per check), inline, on the first core where there are two. The load goes to them in
alternating rounds (`--rounds`, `--requests` each, `--concurrency` at once), so drift in the machine's load falls on
both. Prints the live response's median and p90 for each and their ratio, and writes benchmarks/results/shadow.json.

    python benchmarks/shadow.py [--judge-ms 400] [--rounds 4] [--requests 60] [--concurrency 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proxy_overhead import HERE, free_port, morphguard, process  # noqa: E402


def body(n: int) -> dict[str, object]:
    """A RAG request of its own: no judge call of one is answered from the judge's cache for another."""
    return {"model": "bench", "messages": [
        {"role": "system", "content": f"Answer from <context>The Eiffel Tower is in Paris. It opened in 1889. "
                                      f"Ticket {n} admits one.</context>"},
        {"role": "user", "content": f"Where is the Eiffel Tower? ({n})"}]}


async def round_of(base: str, requests: int, concurrency: int) -> tuple[list[float], set[bool]]:
    times: list[float] = []
    checked: set[bool] = set()
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=60, headers={"authorization": "Bearer sk-bench"}) as client:
        async def one() -> None:
            async with gate:
                started = time.perf_counter()
                response = await client.post(base + "/v1/chat/completions", json=body(time.time_ns()))
                times.append(time.perf_counter() - started)
                response.raise_for_status()
                checked.add(bool(response.json()["morphguard"]["checked"]))
        await asyncio.gather(*(one() for _ in range(requests)))
    return times, checked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--judge-ms", type=float, default=400)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        folder = Path(tmp)
        port = free_port()
        upstream = f"http://127.0.0.1:{port}/v1"
        stack.enter_context(process([sys.executable, str(HERE / "fixed_upstream.py"), str(port), str(args.judge_ms)],
                                    upstream + "/models", folder / "upstream.log"))
        bases = {}
        for name, sample in (("share 0", 0.0), ("share 1", 1.0)):
            cmd, base, log = morphguard(folder, upstream, name.replace(" ", ""))
            config = folder / f"{name.replace(' ', '')}.yaml"
            settings = yaml.safe_load(config.read_text())
            settings["detector"] = {"name": "sentences"}
            # another judge model (served by the same fixed-latency server), so the candidate checks every answer
            settings["shadow"] = {"sample": sample, "candidate": {"judge": {"model": "openai/bench-candidate"}}}
            config.write_text(yaml.safe_dump(settings))
            stack.enter_context(process(cmd, base + "/healthz", log))
            bases[name] = base
        times: dict[str, list[float]] = {name: [] for name in bases}
        checked: set[bool] = set()
        for _ in range(args.rounds):
            for name, base in bases.items():
                took, seen = asyncio.run(round_of(base, args.requests, args.concurrency))
                times[name] += took
                checked |= seen
        time.sleep(2 * args.judge_ms / 1000)  # the last candidate checks finish
        with sqlite3.connect(folder / "share1.db") as db:
            outcomes = [json.loads(o) for (o,) in db.execute("SELECT outcome FROM shadow_verdicts")]
    result = {name: {"n": len(t), "median_ms": round(1000 * statistics.median(t), 1),
                     "p90_ms": round(1000 * sorted(t)[int(0.9 * len(t))], 1)} for name, t in times.items()}
    result["ratio_median"] = round(result["share 1"]["median_ms"] / result["share 0"]["median_ms"], 3)
    result["ratio_p90"] = round(result["share 1"]["p90_ms"] / result["share 0"]["p90_ms"], 3)
    result.update(judge_ms=args.judge_ms, concurrency=args.concurrency, checked=sorted(checked),
                  shadow_verdicts_stored=len(outcomes),
                  candidate_judge_calls=sum(o["llm_calls"] for o in outcomes),
                  candidate_median_ms=round(1000 * statistics.median(o["seconds"] for o in outcomes), 1))
    print(json.dumps(result, indent=2))
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "shadow.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
