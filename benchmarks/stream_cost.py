"""What checking a streamed answer as it flows costs the judge, against the same answer checked buffered.

A scripted upstream on loopback streams an answer of N sentences word by word, evenly over T seconds, as chat
completion chunks; a scripted judge answers the `sentences` check's prompts (every sentence SUPPORTED) after
`--judge-ms`, and records each call: its prompt, its size in tokens (characters / 4) and the longest prefix it
shares with an earlier call of the same answer (what a provider's prefix cache could serve: the cacheable share).
In the same run the answer goes, one stream at a time, through `morphguard serve` with a `block` profile and the
default stream mode (checked as it flows) and through one with `stream_mode: buffer` (the whole answer checked once,
then sent): judge calls, input tokens, the cacheable share, time to first token and to the end of the stream, and
the proxy's CPU time per stream (user + system, from /proc). The context is the answer's own sentences, so beyond
`sentences.context_budget` (24,000 characters: the 600-sentence answer) the passages are cut.

`--reading N,N,...` measures, without a proxy or a judge, the CPU of the `sentences` check's reading of the text
(sentences, their hints and instructions to the checker, the judge's lines, the context's vocabulary) over the checks
of a stream of N sentences, one every 12, on a context of about 200,000 characters: each check reading all of it, and
the stream's checks sharing one memo; and the CPU of the stream engine cutting, holding and releasing the answer
streamed word by word (each check passing at once, so it runs about as many checks as the answer has sentences). The
reading imports `morphguard` from the path (`PYTHONPATH=/tmp/base` measures another checkout).

`--code PATH` runs the proxy from another checkout (`git worktree add --detach /tmp/base main`), so that the same
figures of another version are measured by the same scripts; each is written under its `--label`. Scenarios:
`N:T` (N sentences over T seconds) and `N:T:S` (S such streams at once). Writes benchmarks/results/stream_cost.json.

    python benchmarks/stream_cost.py [--runs 3] [--judge-ms 400] [--scenarios 10:1,120:4,600:8,80:2.7:12]
                                     [--code PATH --label main] [--reading 120,600,2400]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from streaming import free_port, start_proxy, wait_ready  # noqa: E402  (the sibling benchmark's helpers)

QUESTION = "What does the catalogue say about each item?"


def answer_of(n: int, run: str) -> list[str]:
    """N sentences of about 80 characters; `run` makes the answer its own, so the judge can tell streams apart."""
    return [f"Item {i} of catalogue {run} weighs {i * 3 % 997} grams and ships from depot {i % 7} on weekdays."
            for i in range(1, n + 1)]


def upstream_app():  # the scripted upstream and judge, run in its own process
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    calls: list[dict] = []  # per judge call: the answer it belongs to, its prompt's size and cacheable prefix
    prompts: dict[str, list[str]] = {}  # the prompts of each answer, in order

    def shared(prompt: str, earlier: list[str]) -> int:
        best = 0
        for other in earlier:
            n = len(os.path.commonprefix([prompt, other]))
            best = max(best, n)
        return best

    async def chat(request: Request) -> Response:
        body = await request.json()
        if not body.get("stream"):  # a judge call
            text = "\n".join(m["content"] if isinstance(m["content"], str) else
                             "".join(p.get("text", "") for p in m["content"]) for m in body["messages"])
            found = re.search(r"catalogue (\w+)", text)
            run = found.group(1) if found else ""
            cacheable = shared(text, prompts.setdefault(run, []))
            prompts[run].append(text)
            calls.append({"run": run, "tokens": len(text) // 4, "cacheable": cacheable // 4})
            await asyncio.sleep(int(request.query_params.get("ms") or body["model"].split("-")[-1]) / 1000)
            numbered = re.findall(r"^(\d+)\. ", text.split("<answer>")[-1], re.M)
            content = json.dumps({"sentences": [{"id": int(n), "verdict": "SUPPORTED", "phrases": []}
                                                for n in numbered], "answer": "SUPPORTED"})
            return JSONResponse({"id": "j", "object": "chat.completion", "created": 0, "model": body["model"],
                                 "choices": [{"index": 0, "finish_reason": "stop",
                                              "message": {"role": "assistant", "content": content}}],
                                 "usage": {"prompt_tokens": len(text) // 4, "completion_tokens": 8,
                                           "total_tokens": len(text) // 4 + 8}})
        words = re.findall(r"\S+\s*", body["say"])  # the answer the client asked for
        seconds = float(body.get("seconds", 1.0))

        async def chunks():
            base = {"id": "chatcmpl-b", "object": "chat.completion.chunk", "created": 0, "model": body["model"]}
            yield "data: " + json.dumps({**base, "choices": [{"index": 0, "delta": {"role": "assistant"}}]}) + "\n\n"
            started = time.perf_counter()
            for i, word in enumerate(words):
                wait = started + seconds * (i + 1) / len(words) - time.perf_counter()
                if wait > 0:
                    await asyncio.sleep(wait)
                yield "data: " + json.dumps({**base, "choices": [{"index": 0, "delta": {"content": word}}]}) + "\n\n"
            yield "data: " + json.dumps({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}) \
                + "\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": []})

    async def seen(request: Request) -> JSONResponse:
        return JSONResponse(calls)

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]),
                             Route("/v1/models", models, methods=["GET"]), Route("/calls", seen, methods=["GET"])])


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def one_stream(client: httpx.AsyncClient, base: str, sentences: list[str],
                     seconds: float) -> tuple[float, float, str]:
    """(time to the first text, to the end of the stream; the verdict's action)."""
    answer = " ".join(sentences)
    body = {"model": "paced", "stream": True, "seconds": seconds, "say": answer,
            "messages": [{"role": "user", "content": QUESTION}], "morphguard": {"context": sentences}}
    started, first, text, action = time.perf_counter(), None, [], ""
    async with client.stream("POST", base + "/chat/completions", json=body,
                             headers={"Authorization": "Bearer sk-bench"}) as response:
        if response.status_code != 200:
            raise AssertionError(f"{response.status_code}: {(await response.aread())[:300]!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            content = "".join((c.get("delta") or {}).get("content") or "" for c in data.get("choices") or [])
            if content:
                first = first or time.perf_counter()
                text.append(content)
            action = (data.get("morphguard") or {}).get("action", action)
    ended = time.perf_counter()
    assert "".join(text) == answer, f"the stream was changed ({action}): {''.join(text)[-300:]!r}"
    return (first or ended) - started, ended - started, action


async def measure(proxy: str, pid: int, judge: str, n: int, seconds: float, streams: int, runs: int,
                  label: str) -> dict:
    rows: list[dict] = []
    async with httpx.AsyncClient(timeout=300) as client:
        for r in range(runs):
            names = [f"{label}{n}x{streams}r{r}s{s}".replace("_", "") for s in range(streams)]
            cpu = cpu_seconds(pid)
            timed = await asyncio.gather(*(one_stream(client, proxy, answer_of(n, name), seconds) for name in names))
            cpu = cpu_seconds(pid) - cpu
            calls = (await client.get(judge + "/calls")).json()
            for name, (first, end, action) in zip(names, timed, strict=True):
                mine = [c for c in calls if c["run"] == name]
                tokens = sum(c["tokens"] for c in mine)
                rows.append({"calls": len(mine), "tokens": tokens, "action": action,
                             "cacheable": sum(c["cacheable"] for c in mine) / tokens if tokens else 0.0,
                             "first_ms": first * 1000, "end_ms": end * 1000, "cpu_s": cpu / streams})
    median = {k: statistics.median(row[k] for row in rows) for k in ("calls", "tokens", "cacheable", "first_ms",
                                                                       "end_ms", "cpu_s")}
    return {"calls": median["calls"], "calls_range": [min(r["calls"] for r in rows), max(r["calls"] for r in rows)],
            "input_tokens": round(median["tokens"]), "cacheable_share": round(median["cacheable"], 3),
            "first_token_ms": round(median["first_ms"]), "end_ms": round(median["end_ms"]),
            "cpu_s_per_stream": round(median["cpu_s"], 3),
            "actions": sorted({r["action"] for r in rows}), "n": len(rows)}


def reading(n: int) -> dict:
    """CPU seconds of the `sentences` check's reading over a stream's checks of an N-sentence answer, and of the
    stream engine's over the whole stream (`engine`)."""
    from morphguard.config import SentencesSettings
    from morphguard.detectors.sentences import Asked, Sentences
    from morphguard.models import RagInput

    said = answer_of(n, "reading")
    answer = " ".join(said)
    context = [answer] + [f"Passage {k} describes warehouse {k} and its opening hours, with staff notes. " * 25
                          for k in range(100)]
    rag = RagInput(question=QUESTION, passages=context)
    check = Sentences(llm=None, settings=SentencesSettings())  # type: ignore[arg-type]
    ends = [len(" ".join(said[:k])) for k in range(12, n, 12)] + [len(answer)]
    out = {"checks": len(ends), "context_chars": sum(map(len, context))}
    shared = Asked()
    for name, known in (("each_check_alone_s", Asked), ("shared_memo_s", lambda: shared)):
        started = time.process_time()
        for end in ends:
            check._planned(rag, answer[:end], known())  # its sentences, their hints and the judge's lines
        out[name] = round(time.process_time() - started, 3)
    started = time.process_time()
    check._planned(rag, answer, Asked())
    out["one_buffered_check_s"] = round(time.process_time() - started, 3)
    return {**out, **engine(said)}


def engine(said: list[str]) -> dict:
    """CPU seconds of the stream engine (`settle.incremental`) over an answer streamed word by word, each prefix check
    passing at once: cutting, holding and releasing, without the check's own work; and how many checks it ran."""
    from morphguard.settle.incremental import Closing, Incremental
    from tests.passing_checks import Passing

    class Words:  # the stream's events are its words
        def delta(self, event: str) -> str:
            return event

        def opaque(self, event: str) -> bool:
            return False

        def marked(self, event: str, verdict: dict) -> str:
            return event

        def ending(self, sent: list[str], closing: Closing) -> list[str]:
            return []

    words = re.findall(r"\S+\s*", " ".join(said))

    async def stream() -> tuple[int, int]:
        async def events():  # noqa: ANN202
            for word in words:
                yield word
        run = Incremental(Words(), Passing())  # type: ignore[arg-type]
        out = [event async for event in run.run(events())]
        return len(out), len(run.checked)

    started = time.process_time()
    sent, checks = asyncio.run(stream())
    assert sent == len(words)
    return {"engine_s": round(time.process_time() - started, 3), "engine_checks": checks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--judge-ms", type=int, default=400)
    parser.add_argument("--scenarios", default="10:1,120:4,600:8,80:2.7:12")
    parser.add_argument("--code", type=Path, default=ROOT, help="the checkout whose proxy is measured")
    parser.add_argument("--label", default="this", help="the name its figures are written under")
    parser.add_argument("--reading", help="answer lengths whose reading is measured alone (no proxy, no judge)")
    parser.add_argument("--upstream", type=int, help=argparse.SUPPRESS)  # run as the scripted upstream
    args = parser.parse_args()
    if args.reading:
        out = HERE / "results" / "stream_cost.json"
        previous = json.loads(out.read_text()) if out.exists() else {}
        for n in map(int, args.reading.split(",")):
            previous.setdefault("reading", {}).setdefault(args.label, {})[str(n)] = figures = reading(n)
            print(f"{args.label:>6} reading {n} sentences: {figures}", flush=True)
        out.write_text(json.dumps(previous, indent=2) + "\n")
        return
    if args.upstream:
        import uvicorn

        # idle connections kept open past the proxies' pools' own idle time: a pooled connection is never found closed
        uvicorn.run(upstream_app(), host="127.0.0.1", port=args.upstream, log_level="warning", timeout_keep_alive=300)
        return
    port = free_port()
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        log = folder / "upstream.log"
        upstream = subprocess.Popen([sys.executable, __file__, "--upstream", str(port)], stdout=log.open("wb"),
                                    stderr=subprocess.STDOUT)
        judge = f"http://127.0.0.1:{port}"
        started: list[subprocess.Popen] = []
        try:
            wait_ready(judge + "/v1/models", upstream, log)
            proxies = {}
            for mode in ("auto", "buffer"):
                (folder / mode).mkdir()
                judging = {"model": f"openai/judge-{args.judge_ms}", "api_base": judge + "/v1", "api_key": "k",
                           "max_attempts": 1, "cache": {"enabled": False}}
                base, process = start_proxy(folder / mode, judge + "/v1", judging, "auto", mode, args.code.resolve())
                started.append(process)
                proxies["streamed" if mode == "auto" else "buffered"] = (base, process.pid)
            for scenario in args.scenarios.split(","):
                n, seconds, streams = (scenario.split(":") + ["1"])[:3]
                key = f"{n} sentences over {seconds} s" + (f", {streams} streams at once" if streams != "1" else "")
                results[key] = {}
                for name, (base, pid) in proxies.items():
                    results[key][name] = figures = asyncio.run(measure(base, pid, judge, int(n), float(seconds),
                                                                       int(streams), args.runs,
                                                                       f"{args.label}{name}"))
                    print(f"{args.label:>6} {key:>38} {name:>8}: calls {figures['calls']:6} "
                          f"{figures['calls_range']}, input tokens {figures['input_tokens']:8}, cacheable "
                          f"{figures['cacheable_share']:.0%}, first token {figures['first_token_ms']:6} ms, end "
                          f"{figures['end_ms']:6} ms, CPU {figures['cpu_s_per_stream']:.3f} s, {figures['actions']}",
                          flush=True)
        finally:
            for process in [*started, upstream]:
                process.terminate()
                process.wait(30)
    out = HERE / "results" / "stream_cost.json"
    previous = json.loads(out.read_text()) if out.exists() else {}
    previous.setdefault("versions", {})[args.label] = results
    previous["setup"] = {"judge_ms": args.judge_ms, "runs": args.runs, "stat": "median over runs and streams",
                         "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared)"}
    out.write_text(json.dumps(previous, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
