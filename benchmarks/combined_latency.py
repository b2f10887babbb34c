"""How long one `combined` check waits for an API judge: its parts one at a time, or at once.

A fixed-latency OpenAI-compatible server (benchmarks/fixed_upstream.py) stands in for a paid judge on
loopback. The same answer, which makes the shipped weights ask all three judge parts (`direct`, a
`restatement` of its changed copy, the spot check of its unsupported sentence), is checked `--checks` times
with the judge's `concurrency` at 1 (each part waits for the one before, as the
embedded judge's client queues them) and at the default 8 (the parts at once). The cascade is off
(`combined: {cascade: null}`): it would hold `direct` back until the others answer. Prints the median wall
time per check in both modes and their ratio; writes benchmarks/results/combined_latency.json.

    python benchmarks/combined_latency.py [--latency-ms 300] [--checks 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proxy_overhead import HERE, free_port, process  # noqa: E402

from morphguard.config import Config  # noqa: E402
from morphguard.detectors import build_detector  # noqa: E402
from morphguard.models import RagInput  # noqa: E402

PASSAGES = ["The bridge opened in 1932. It carries four lanes of traffic. Its towers are 134 metres tall."]
ANSWER = "The bridge did not open in 1932. Its towers were painted by Gustave Eiffel."


def timed(base_url: str, concurrency: int, checks: int) -> tuple[list[float], int]:
    config = Config.model_validate({"judge": {"model": "openai/bench", "api_base": base_url, "api_key": "sk-bench",
                                              "concurrency": concurrency, "cache": {"enabled": False}},
                                    "combined": {"cascade": None}})  # every part asked, as an API judge would
    detector = build_detector(config, name="combined")
    rag = RagInput(question="Tell me about the bridge.", passages=PASSAGES)

    async def run() -> tuple[list[float], int]:
        seconds, calls = [], 0
        for _ in range(checks):
            started = time.perf_counter()
            result = await detector.detect(rag, ANSWER)
            seconds.append(time.perf_counter() - started)
            calls = result.cost.llm_calls
        return seconds, calls

    return asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-ms", type=float, default=300)
    parser.add_argument("--checks", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        port = free_port()
        base = f"http://127.0.0.1:{port}/v1"
        stack.enter_context(process([sys.executable, str(HERE / "fixed_upstream.py"), str(port), str(args.latency_ms)],
                                    base + "/models", Path(tmp) / "upstream.log"))
        one_by_one, calls = timed(base, 1, args.checks)
        at_once, calls_at_once = timed(base, 8, args.checks)
    result = {"judge_latency_ms": args.latency_ms, "checks": args.checks, "judge_calls_per_check": calls,
              "median_s_one_at_a_time": round(statistics.median(one_by_one), 3),
              "median_s_at_once": round(statistics.median(at_once), 3)}
    assert calls == calls_at_once
    result["ratio"] = round(result["median_s_at_once"] / result["median_s_one_at_a_time"], 3)
    print(f"combined check, {calls} judge calls, judge latency {args.latency_ms:g} ms, {args.checks} checks each: "
          f"median {result['median_s_one_at_a_time']} s one at a time, {result['median_s_at_once']} s at once "
          f"(ratio {result['ratio']})")
    out = HERE / "results" / "combined_latency.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
