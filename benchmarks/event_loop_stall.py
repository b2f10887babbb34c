"""Does one hostile request stall everyone else? /healthz latency while pathological requests are processed.

A fixed-latency upstream and morphguard run on loopback. /healthz is probed every 20 ms, first with the proxy idle,
then under load. Two scenarios (`--scenario`):

- `hostile` (the `length` detector, so no judge time is involved): two clients keep sending, one after another, a
  system message of 18,000 unclosed `<context>` tags (160 KB; the old tag regex took ~19 s on it) and a 4 MB explicit
  context (topic tagging over it took 5-6 s before).
- `sentences` (the default check with an API judge; the fixed-latency server is the judge too): one client keeps
  sending `/v1/check` with an answer of `--sentences` short sentences (600 by default, 50 judge calls) and a 190 KB
  context, so that every call's prompt is the context focused on its batch.

Prints p50/p99/max of /healthz in both phases and writes benchmarks/results/event_loop_stall[_sentences].json. Run it
against another checkout's code with PYTHONPATH=<that checkout> (the proxy runs as a subprocess, which inherits it).

    python benchmarks/event_loop_stall.py [--seconds 20] [--scenario hostile|sentences] [--sentences 600]
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
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proxy_overhead import HERE, free_port, morphguard, process  # noqa: E402

PASSAGE = "Ibuprofen is contraindicated in the third trimester of pregnancy."
HOSTILE = {"model": "bench", "messages": [{"role": "system", "content": "<context>" * 18_000},
                                          {"role": "user", "content": "Can I take ibuprofen?"}]}
BIG = {"model": "bench", "messages": [{"role": "user", "content": "Can I take ibuprofen?"}],
       "morphguard": {"context": [PASSAGE + " pregnancy dose " * 200] * 1_200}}  # ~3.9 MB
KEY = "sk-bench-stall"


def many_sentences(count: int) -> dict[str, object]:
    """A /v1/check of `count` short sentences against a 190 KB context of distinct sentences."""
    context = [" ".join(f"Clinic {p} opens at {7 + s % 5} on day {s} for patients of ward {p * 40 + s}."
                        for s in range(40)) for p in range(70)]
    answer = " ".join(f"Ward {n} opens at {7 + n % 5}." for n in range(count))
    return {"question": "When does each ward open?", "context": context, "answer": answer}


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
    parser.add_argument("--scenario", choices=["hostile", "sentences"], default="hostile")
    parser.add_argument("--sentences", type=int, default=600)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        folder = Path(tmp)
        port = free_port()
        upstream = f"http://127.0.0.1:{port}/v1"
        stack.enter_context(process([sys.executable, str(HERE / "fixed_upstream.py"), str(port), "5"],
                                    upstream + "/models", folder / "upstream.log"))
        if args.scenario == "hostile":
            cmd, base, log = morphguard(folder, upstream, "guard")
            config = folder / "guard.yaml"
            config.write_text(config.read_text() + "detector: {name: length}\n")
            load = [("hostile", "/v1/chat/completions", HOSTILE), ("big", "/v1/chat/completions", BIG)]
        else:
            cmd, base, log = morphguard(folder, upstream, "guard", keys=[KEY])
            config = folder / "guard.yaml"
            settings = yaml.safe_load(config.read_text())
            settings["detector"] = {"name": "sentences"}  # the judge is probed at start, as by default
            config.write_text(yaml.safe_dump(settings))
            load = [("sentences", "/v1/check", many_sentences(args.sentences))]
        stack.enter_context(process(cmd, base + "/healthz", log))
        idle = probe(base, args.seconds / 2)
        stop = threading.Event()
        sent = {name: 0 for name, _, _ in load}
        statuses: set[int] = set()
        reasons: set[str] = set()

        def hammer(name: str, path: str, body: dict) -> None:
            raw = json.dumps(body).encode()
            with httpx.Client(timeout=300) as client:
                while not stop.is_set():
                    response = client.post(base + path, content=raw, headers={
                        "content-type": "application/json", "authorization": f"Bearer {KEY}"})
                    statuses.add(response.status_code)
                    if path == "/v1/check" and response.status_code == 200:
                        reasons.add(str(response.json().get("reason")))
                    sent[name] += 1

        workers = [threading.Thread(target=hammer, args=item) for item in load]
        for w in workers:
            w.start()
        loaded = probe(base, args.seconds)
        stop.set()
        for w in workers:
            w.join()
    result = {"scenario": args.scenario, "idle": summary(idle), "under_hostile_load": summary(loaded),
              "requests_sent": sent, "statuses": sorted(statuses), "check_reasons": sorted(reasons)}
    print(f"{'phase':<20} {'n':>5} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for phase in ("idle", "under_hostile_load"):
        r = result[phase]
        print(f"{phase:<20} {r['n']:>5} {r['p50_ms']:>8} {r['p99_ms']:>8} {r['max_ms']:>8}")
    print(f"hostile requests answered: {sent}, statuses {sorted(statuses)}, check reasons {sorted(reasons)}")
    out = HERE / "results" / ("event_loop_stall.json" if args.scenario == "hostile" else
                              f"event_loop_stall_{args.scenario}.json")
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
