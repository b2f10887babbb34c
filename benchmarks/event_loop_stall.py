"""Does one hostile request stall everyone else? /healthz latency while pathological requests are processed.

A fixed-latency upstream and morphguard (`length` detector, so no judge time is involved) run on loopback.
/healthz is probed every 20 ms, first with the proxy idle, then while two clients keep sending, one after
another, a system message of 18,000 unclosed `<context>` tags (160 KB; the old tag regex took ~19 s on it)
and a 4 MB explicit context (topic tagging over it took 5-6 s before). Prints p50/p99/max of /healthz in
both phases and writes benchmarks/results/event_loop_stall.json.

    python benchmarks/event_loop_stall.py [--seconds 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proxy_overhead import HERE, free_port, morphguard, process  # noqa: E402

PASSAGE = "Ibuprofen is contraindicated in the third trimester of pregnancy."
HOSTILE = {"model": "bench", "messages": [{"role": "system", "content": "<context>" * 18_000},
                                          {"role": "user", "content": "Can I take ibuprofen?"}]}
BIG = {"model": "bench", "messages": [{"role": "user", "content": "Can I take ibuprofen?"}],
       "morphguard": {"context": [PASSAGE + " pregnancy dose " * 200] * 1_200}}  # ~3.9 MB


def probe(base: str, seconds: float) -> list[float]:
    latencies = []
    with httpx.Client(timeout=30) as client:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            started = time.perf_counter()
            client.get(base + "/healthz").raise_for_status()
            latencies.append((time.perf_counter() - started) * 1000)
            time.sleep(0.02)
    return latencies


def summary(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    return {"n": len(ordered), "p50_ms": round(statistics.median(ordered), 2),
            "p99_ms": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 2),
            "max_ms": round(ordered[-1], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        folder = Path(tmp)
        port = free_port()
        upstream = f"http://127.0.0.1:{port}/v1"
        stack.enter_context(process([sys.executable, str(HERE / "fixed_upstream.py"), str(port), "5"],
                                    upstream + "/models", folder / "upstream.log"))
        cmd, base, log = morphguard(folder, upstream, "guard")
        config = folder / "guard.yaml"
        config.write_text(config.read_text() + "detector: {name: length}\n")
        stack.enter_context(process(cmd, base + "/healthz", log))
        idle = probe(base, args.seconds / 2)
        stop = threading.Event()
        sent = {"hostile": 0, "big": 0}
        statuses: set[int] = set()

        def hammer(name: str, body: dict) -> None:
            raw = json.dumps(body).encode()
            with httpx.Client(timeout=120) as client:
                while not stop.is_set():
                    response = client.post(base + "/v1/chat/completions", content=raw,
                                           headers={"content-type": "application/json"})
                    statuses.add(response.status_code)
                    sent[name] += 1

        workers = [threading.Thread(target=hammer, args=item) for item in (("hostile", HOSTILE), ("big", BIG))]
        for w in workers:
            w.start()
        loaded = probe(base, args.seconds)
        stop.set()
        for w in workers:
            w.join()
    result = {"idle": summary(idle), "under_hostile_load": summary(loaded), "requests_sent": sent,
              "statuses": sorted(statuses)}
    print(f"{'phase':<20} {'n':>5} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for phase in ("idle", "under_hostile_load"):
        r = result[phase]
        print(f"{phase:<20} {r['n']:>5} {r['p50_ms']:>8} {r['p99_ms']:>8} {r['max_ms']:>8}")
    print(f"hostile requests answered: {sent}, statuses {sorted(statuses)}")
    out = HERE / "results" / "event_loop_stall.json"
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
