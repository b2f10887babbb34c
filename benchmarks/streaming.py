"""What checking a stream as it flows adds to time to first token and to last token.

A scripted upstream on loopback streams a five-sentence answer a word at a time at a model's pace (`--tps` words
a second, 40 by default) and answers judge calls after a fixed delay. In the same run, the same request is sent,
one at a time and in turn: to the upstream directly (the stream unchecked), and through `morphguard serve` with a
`block` profile and the default stream settings (checked sentence by sentence as it flows). Time to first token
is to the first content delta, time to last token to the end of the stream (`[DONE]`). A checked stream's first
token waits for its first sentence to be written and checked, so the added time to first token is also given
beyond the time the upstream takes to write that sentence (the check's own share). Scenarios: the
`grounding` detector alone (no judge), the `direct` detector over a scripted judge of `--judge-ms` per call, and
with `--embedded` the default detector over the embedded judge (slow on shared cores: run it once). Writes
benchmarks/results/streaming.json.

    python benchmarks/streaming.py [--runs 10] [--tps 40] [--judge-ms 400] [--embedded]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SENTENCES = [
    "The Eiffel Tower stands on the Champ de Mars in Paris.",
    "It was built for the World's Fair of 1889.",
    "Gustave Eiffel's company designed and built it.",
    "The tower is about 330 metres tall including its antennas.",
    "It was the tallest man-made structure in the world until 1930.",
]
ANSWER = " ".join(SENTENCES)
CONTEXT = " ".join(SENTENCES)
QUESTION = "Tell me about the Eiffel Tower."


def upstream_app(tps: float):  # the scripted upstream, run in its own process
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    async def chat(request: Request) -> Response:
        body = await request.json()
        model = str(body.get("model", ""))
        if not body.get("stream"):  # a judge call: {"verdict": "YES"} after the judge's delay
            if model.startswith("judge-"):
                await asyncio.sleep(int(model.removeprefix("judge-").removesuffix("ms")) / 1000)
            content = json.dumps({"verdict": "YES", "unsupported": []})
            return JSONResponse({"id": "j", "object": "chat.completion", "created": 0, "model": model,
                                 "choices": [{"index": 0, "finish_reason": "stop",
                                              "message": {"role": "assistant", "content": content}}],
                                 "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

        async def chunks():
            base = {"id": "chatcmpl-b", "object": "chat.completion.chunk", "created": 0, "model": model}
            yield "data: " + json.dumps({**base, "choices": [{"index": 0, "delta": {"role": "assistant"}}]}) + "\n\n"
            words = ANSWER.split(" ")
            for i, word in enumerate(words):
                await asyncio.sleep(1 / tps)
                delta = {"content": word + (" " if i < len(words) - 1 else "")}
                yield "data: " + json.dumps({**base, "choices": [{"index": 0, "delta": delta}]}) + "\n\n"
            yield "data: " + json.dumps({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
            yield "\n\ndata: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": []})

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]),
                             Route("/v1/models", models, methods=["GET"])])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, process: subprocess.Popen[bytes], log: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"exited:\n{log.read_text()}")
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise RuntimeError(f"not ready:\n{log.read_text()}")


def start_proxy(folder: Path, upstream: str, judge: dict, detector: str) -> tuple[str, subprocess.Popen[bytes]]:
    config = {"judge": judge, "detector": {"name": detector},
              "proxy": {"upstream": {"base_url": upstream}},
              "policy": {"profiles": {"general": {"action": "block", "topics": {}}},
                         "audit": {"path": str(folder / "audit.db")}}}
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = folder / "proxy.log"
    command = [sys.executable, "-m", "morphguard.cli", "serve", "--config", str(folder / "config.yaml"),
               "--port", str(port)]
    process = subprocess.Popen(command, cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    wait_ready(f"http://127.0.0.1:{port}/healthz", process, log)
    return f"http://127.0.0.1:{port}/v1", process


async def timed_stream(client: httpx.AsyncClient, base: str,
                       checked: bool) -> tuple[float, float, float, str]:
    """(time to first content delta, to the first sentence's last token, to the stream's end; the text)."""
    body = {"model": "paced", "stream": True, "messages": [{"role": "user", "content": QUESTION}]}
    if checked:
        body["morphguard"] = {"context": [CONTEXT]}
    started = time.perf_counter()
    first, sentence, text = None, None, []
    async with client.stream("POST", base + "/chat/completions", json=body,
                             headers={"Authorization": "Bearer sk-bench"}) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                content = (choice.get("delta") or {}).get("content")
                if content:
                    first = first or time.perf_counter()
                    text.append(content)
                    if sentence is None and len("".join(text).rstrip()) >= len(SENTENCES[0]):
                        sentence = time.perf_counter()
    ended = time.perf_counter()
    return (first or ended) - started, (sentence or ended) - started, ended - started, "".join(text)


async def measure(direct: str, proxy: str, runs: int) -> dict:
    times: dict[str, list[tuple[float, float, float]]] = {"direct": [], "checked": []}
    async with httpx.AsyncClient(timeout=120) as client:
        await timed_stream(client, proxy, True)  # warm: the first check loads what the detector needs
        for _ in range(runs):
            for name, base, checked in (("direct", direct, False), ("checked", proxy, True)):
                ttft, first_sentence, ttlt, text = await timed_stream(client, base, checked)
                assert text == ANSWER, f"{name}: the stream was changed: {text!r}"
                times[name].append((ttft, first_sentence, ttlt))

    def median_ms(name: str, i: int) -> float:
        return round(statistics.median(t[i] for t in times[name]) * 1000, 1)

    out = {name: {"ttft_ms": median_ms(name, 0), "first_sentence_ms": median_ms(name, 1), "ttlt_ms": median_ms(name, 2)}
           for name in times}
    # The first token leaves once the first sentence is written and checked: beyond the writing, the check's cost.
    out["added"] = {"ttft_ms": round(out["checked"]["ttft_ms"] - out["direct"]["ttft_ms"], 1),
                    "ttft_after_first_sentence_ms": round(out["checked"]["ttft_ms"]
                                                          - out["direct"]["first_sentence_ms"], 1),
                    "ttlt_ms": round(out["checked"]["ttlt_ms"] - out["direct"]["ttlt_ms"], 1)}
    return out


def audited(path: Path) -> dict[str, int]:
    """How the checked streams were recorded (action and reason): a check that failed would look fast."""
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT action, checked, coalesce(reason, '') FROM decisions").fetchall()
    out: dict[str, int] = {}
    for action, checked, reason in rows:
        key = f"{action}{'' if checked else ' unchecked'}{': ' + reason if reason else ''}"
        out[key] = out.get(key, 0) + 1
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--tps", type=float, default=40.0, help="words per second the upstream writes")
    parser.add_argument("--judge-ms", type=int, default=400)
    parser.add_argument("--embedded", action="store_true", help="also the default detector over the embedded judge")
    parser.add_argument("--upstream", type=int, help=argparse.SUPPRESS)  # run as the scripted upstream
    args = parser.parse_args()
    if args.upstream:
        import uvicorn

        uvicorn.run(upstream_app(args.tps), host="127.0.0.1", port=args.upstream, log_level="warning")
        return
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        log = folder / "upstream.log"
        upstream = subprocess.Popen([sys.executable, __file__, "--upstream", str(port), "--tps", str(args.tps)],
                                    stdout=log.open("wb"), stderr=subprocess.STDOUT)
        direct = f"http://127.0.0.1:{port}/v1"
        # The judge cache is off: every run repeats the same answer, and a cached verdict would cost nothing.
        scenarios = [("grounding", {"model": "openai/judge-0ms", "api_base": direct, "api_key": "k"}, "grounding"),
                     (f"judge_{args.judge_ms}ms", {"model": f"openai/judge-{args.judge_ms}ms", "api_base": direct,
                                                   "api_key": "k", "max_attempts": 1, "cache": {"enabled": False}},
                      "direct")]
        if args.embedded:
            scenarios.append(("embedded", {"model": "local", "cache": {"enabled": False}}, "auto"))
        results: dict = {}
        try:
            wait_ready(direct + "/models", upstream, log)
            for name, judge, detector in scenarios:
                where = folder / name
                where.mkdir()
                proxy, process = start_proxy(where, direct, judge, detector)
                try:
                    results[name] = asyncio.run(measure(direct, proxy, args.runs))
                finally:
                    process.terminate()
                    process.wait(30)
                results[name]["audit"] = audited(where / "audit.db")
                print(f"{name:>16}: direct TTFT {results[name]['direct']['ttft_ms']:7.1f} ms, TTLT "
                      f"{results[name]['direct']['ttlt_ms']:7.1f} ms | checked TTFT "
                      f"{results[name]['checked']['ttft_ms']:7.1f} ms, TTLT {results[name]['checked']['ttlt_ms']:7.1f}"
                      f" ms | added TTFT {results[name]['added']['ttft_ms']:+7.1f} ms (after the first sentence "
                      f"{results[name]['added']['ttft_after_first_sentence_ms']:+7.1f} ms), TTLT "
                      f"{results[name]['added']['ttlt_ms']:+7.1f} ms")
        finally:
            upstream.terminate()
            upstream.wait(30)
    out = HERE / "results" / "streaming.json"
    previous = json.loads(out.read_text()) if out.exists() else {}
    previous.get("scenarios", {}).update(results)
    out.write_text(json.dumps({
        "setup": {"runs": args.runs, "words_per_second": args.tps, "sentences": len(SENTENCES),
                  "words": len(ANSWER.split()), "judge_ms": args.judge_ms, "stat": "median",
                  "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared)"},
        "scenarios": {**previous.get("scenarios", {}), **results}}, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
