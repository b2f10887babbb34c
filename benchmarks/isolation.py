"""Can one client's large checks push another's past its budget? A victim's check time alone and under load.

A fixed-latency server (`--judge-ms`, the judge of the `sentences` check) and morphguard run on loopback, each client
with its own proxy key. The victim sends a small `/v1/check` (three sentences, one judge call), one after another,
first alone, then while `--clients` other clients each keep sending, one after another, the largest check the proxy
makes: `--sentences` sentences (just under `detector.max_judge_calls` calls at the default batch) against a context
that brings answer and context just under `detector.max_text_chars`. Prints the victim's median and p90 in both
phases and their ratio, and writes benchmarks/results/isolation.json. Run it against another checkout's code with
PYTHONPATH=<that checkout> (the proxy runs as a subprocess, which inherits it).

    python benchmarks/isolation.py [--seconds 30] [--clients 6] [--judge-ms 100] [--sentences 1150]
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

VICTIM = {"question": "When does the clinic open?",
          "context": ["The clinic opens at eight on weekdays. It closes at six. Saturday hours are ten to two."],
          "answer": "The clinic opens at eight on weekdays. It closes at six. On Saturdays it opens at ten."}


def largest(sentences: int, chars: int) -> dict[str, object]:
    """A check of `sentences` short sentences against a context of distinct sentences, `chars` characters in all."""
    answer = " ".join(f"Ward {n} opens at {7 + n % 5}." for n in range(sentences))
    passage = " ".join(f"Clinic {p} opens at {7 + p % 5} on day {p % 7} for the patients of ward {p}."
                       for p in range(200))
    count = max(1, (chars - len(answer)) // (len(passage) + 1))
    return {"question": "When does each ward open?", "context": [passage] * count, "answer": answer}


def timed(client: httpx.Client, base: str, key: str, body: bytes) -> tuple[float, str]:
    started = time.perf_counter()
    response = client.post(base + "/v1/check", content=body, headers={
        "content-type": "application/json", "authorization": f"Bearer {key}"})
    response.raise_for_status()
    return time.perf_counter() - started, str(response.json().get("reason"))


def victim(base: str, seconds: float) -> tuple[list[float], set[str]]:
    """The victim's checks, one after another; each question differs, so that none is answered from the cache."""
    times: list[float] = []
    reasons: set[str] = set()
    with httpx.Client(timeout=300) as client:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline or len(times) < 5:
            raw = json.dumps({**VICTIM, "question": f"{VICTIM['question']} ({time.time_ns()})"}).encode()
            took, reason = timed(client, base, "sk-victim", raw)
            times.append(took)
            reasons.add(reason)
    return times, reasons


def summary(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {"n": len(ordered), "median_s": round(statistics.median(ordered), 3),
            "p90_s": round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], 3), "max_s": round(ordered[-1], 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--judge-ms", type=float, default=100)
    parser.add_argument("--sentences", type=int, default=1150)
    parser.add_argument("--chars", type=int, default=990_000)
    args = parser.parse_args()
    keys = ["sk-victim"] + [f"sk-heavy-{n}" for n in range(args.clients)]
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        folder = Path(tmp)
        port = free_port()
        judge = f"http://127.0.0.1:{port}/v1"
        stack.enter_context(process([sys.executable, str(HERE / "fixed_upstream.py"), str(port), str(args.judge_ms)],
                                    judge + "/models", folder / "judge.log"))
        cmd, base, log = morphguard(folder, judge, "guard", keys=keys)
        config = folder / "guard.yaml"
        settings = yaml.safe_load(config.read_text())
        settings["detector"] = {"name": "sentences"}
        config.write_text(yaml.safe_dump(settings))
        stack.enter_context(process(cmd, base + "/healthz", log))
        alone, alone_reasons = victim(base, args.seconds / 3)
        stop = threading.Event()
        heavy: list[float] = []
        heavy_reasons: set[str] = set()
        body = largest(args.sentences, args.chars)
        raw = json.dumps(body).encode()

        def hammer(key: str) -> None:
            with httpx.Client(timeout=600) as client:
                while not stop.is_set():
                    asked = json.dumps({**body, "question": f"{body['question']} ({key} {time.time_ns()})"}).encode()
                    took, reason = timed(client, base, key, asked)
                    heavy.append(took)
                    heavy_reasons.add(reason)

        workers = [threading.Thread(target=hammer, args=(key,)) for key in keys[1:]]
        for w in workers:
            w.start()
        time.sleep(2)  # the large checks under way
        loaded, loaded_reasons = victim(base, args.seconds)
        stop.set()
        for w in workers:
            w.join()
    result = {"alone": summary(alone), "under_load": summary(loaded),
              "ratio_median": round(statistics.median(loaded) / statistics.median(alone), 2),
              "ratio_p90": round(summary(loaded)["p90_s"] / summary(alone)["p90_s"], 2),
              "heavy_checks": summary(heavy) if heavy else None, "body_bytes": len(raw),
              "victim_reasons": sorted(alone_reasons | loaded_reasons), "heavy_reasons": sorted(heavy_reasons),
              "clients": args.clients, "judge_ms": args.judge_ms}
    print(f"{'victim':<12} {'n':>4} {'median s':>9} {'p90 s':>7} {'max s':>7}")
    for phase in ("alone", "under_load"):
        r = result[phase]
        print(f"{phase:<12} {r['n']:>4} {r['median_s']:>9} {r['p90_s']:>7} {r['max_s']:>7}")
    print(f"under load / alone: median {result['ratio_median']}x, p90 {result['ratio_p90']}x; "
          f"{len(heavy)} large checks ({len(raw):,} bytes each) answered, reasons {sorted(heavy_reasons)}; "
          f"victim reasons {result['victim_reasons']}")
    out = HERE / "results" / "isolation.json"
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
