"""Do rotating, shared or absent keys buy a client turns at the judge? A victim's time behind a burst of 48 checks.

Pass-through chat on loopback, as in front of vLLM, Ollama or a local server (an upstream that takes any key): a fixed
upstream answering at once, a fixed judge (`--judge-ms`, 400 by default) with `judge.concurrency` 8, the `sentences`
check under a `block` profile with a 1.5 s latency budget. The victim (its own loopback address, 127.0.0.2, and its
own key) asks one chat completion, first alone, then each round just after `--burst` requests from another address
(127.0.0.1) that present one key, a new key each, or, with the victim presenting the same, the placeholder `EMPTY`
each or no key. Prints the victim's median and worst time per case, the ratio to its time alone, and the reasons its
verdicts gave, and writes benchmarks/results/fair_turns.json. To measure another checkout, run a copy of this file
beside that checkout's proxy_overhead.py and fixed_upstream.py, from that checkout (the proxy runs from its folder).

    python benchmarks/fair_turns.py [--rounds 5] [--burst 48] [--judge-ms 400] [--lead-s 0.3]
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

CONTEXT = "Gustave Eiffel built his iron lattice tower on the Champ de Mars, in the French capital."
# case → (the key the victim presents, the key of the burst's n-th request)
CASES = {"one key": ("sk-victim", lambda n: "sk-one"),
         "rotating keys": ("sk-victim", lambda n: f"sk-rotating-{n}-{time.time_ns()}"),
         "shared EMPTY": ("EMPTY", lambda n: "EMPTY"), "no key": (None, lambda n: None)}


def ask(client: httpx.Client, base: str, key: str | None, n: int) -> tuple[float, str]:
    body = {"model": "m", "messages": [{"role": "user", "content": f"Where is the tower? ({n} {time.time_ns()})"}],
            "morphguard": {"context": [f"{CONTEXT} Note {n}-{time.time_ns()}."]}}  # no judge reply cached
    headers = {"authorization": f"Bearer {key}"} if key else {}
    started = time.perf_counter()
    response = client.post(base + "/v1/chat/completions", json=body, headers=headers)
    took = time.perf_counter() - started
    verdict = response.json().get("morphguard", {}) if response.status_code == 200 else {}
    return took, f"{response.status_code} {verdict.get('action')} {verdict.get('reason')}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--burst", type=int, default=48)
    parser.add_argument("--judge-ms", type=float, default=400)
    parser.add_argument("--lead-s", type=float, default=0.3, help="how long the burst has before the victim asks")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        folder = Path(tmp)
        judge_port, upstream_port = free_port(), free_port()
        judge, upstream = f"http://127.0.0.1:{judge_port}/v1", f"http://127.0.0.1:{upstream_port}/v1"
        for port, ms, url, name in ((judge_port, args.judge_ms, judge, "judge"), (upstream_port, 0, upstream, "up")):
            stack.enter_context(process([sys.executable, str(HERE / "fixed_upstream.py"), str(port), str(ms)],
                                        url + "/models", folder / f"{name}.log"))
        cmd, base, log = morphguard(folder, upstream, "guard")
        config = folder / "guard.yaml"
        settings = yaml.safe_load(config.read_text())
        settings["judge"]["api_base"] = judge
        settings["detector"] = {"name": "sentences"}
        settings["policy"]["profiles"] = {"general": {"action": "block", "topics": {}, "latency_budget_s": 1.5}}
        config.write_text(yaml.safe_dump(settings))
        stack.enter_context(process(cmd, base + "/healthz", log))
        victim = stack.enter_context(httpx.Client(timeout=60, transport=httpx.HTTPTransport(
            local_address="127.0.0.2")))
        attacker = stack.enter_context(httpx.Client(timeout=60, limits=httpx.Limits(max_connections=args.burst)))
        for n in range(3):  # warm: connections, the proxy's first requests
            ask(victim, base, "sk-victim", n)
        result: dict[str, dict[str, object]] = {}
        alone = [ask(victim, base, "sk-victim", n) for n in range(args.rounds)]
        result["alone"] = {"times_s": [round(t, 3) for t, _ in alone], "reasons": sorted({r for _, r in alone})}
        for case, (own, key_of) in CASES.items():
            times, reasons = [], set()
            for round_ in range(args.rounds):
                burst = [threading.Thread(target=ask, args=(attacker, base, key_of(n), n)) for n in range(args.burst)]
                for thread in burst:
                    thread.start()
                time.sleep(args.lead_s)  # the burst's checks are waiting for the judge
                took, reason = ask(victim, base, own, round_)
                times.append(took)
                reasons.add(reason)
                for thread in burst:
                    thread.join()
            result[case] = {"times_s": [round(t, 3) for t in times], "reasons": sorted(reasons)}
    base_median = statistics.median(result["alone"]["times_s"])  # type: ignore[arg-type]
    print(f"{'victim':<16} {'n':>3} {'median ms':>10} {'max ms':>8} {'x alone':>8}  reasons")
    for case, row in result.items():
        times = row["times_s"]
        assert isinstance(times, list)
        row["median_s"] = statistics.median(times)
        row["ratio"] = round(statistics.median(times) / base_median, 2)
        print(f"{case:<16} {len(times):>3} {1000 * statistics.median(times):>10.0f} {1000 * max(times):>8.0f} "
              f"{row['ratio']:>8}  {row['reasons']}")
    out = HERE / "results" / "fair_turns.json"
    out.write_text(json.dumps({"burst": args.burst, "judge_ms": args.judge_ms, "rounds": args.rounds, **result},
                              indent=2) + "\n")


if __name__ == "__main__":
    main()
