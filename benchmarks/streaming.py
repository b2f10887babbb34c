"""What checking a stream as it flows adds to time to first token and to last token, on each API.

A scripted upstream on loopback streams a five-sentence answer a word at a time at a model's pace (`--tps` words
a second, 40 by default), as chat completion chunks, Responses events and Messages events, and answers judge
calls after a fixed delay. In the same run, the same request is sent, one at a time and in turn: to the upstream
directly (the stream unchecked), through `morphguard serve` with the same detector and `stream_mode: passthrough`
(relayed as it comes, checked once at the end: the verdict's last event waits for that check), and through
`morphguard serve` with a `block` profile and the default stream settings (checked as it flows: text goes out once
a prefix of the answer up to it has passed the whole-answer check), for each API. Time to first token is to the
first text delta, time to last token to the end of the stream. A checked stream's first token waits for its first
sentence to be written and checked, so the added time to first token is also given beyond the time the upstream
takes to write that sentence (the check's own share). Scenarios: the `grounding` detector alone (no judge), the
`direct` detector over a scripted judge of `--judge-ms` per call, and with `--embedded` the default detector over
the embedded judge (slow on shared cores: run it once). Writes
benchmarks/results/streaming.json.

    python benchmarks/streaming.py [--runs 10] [--tps 40] [--judge-ms 400] [--embedded] [--only NAME]
                                   [--apis chat,responses,messages]
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

    judged = [0]  # judge calls answered

    async def chat(request: Request) -> Response:
        body = await request.json()
        model = str(body.get("model", ""))
        if not body.get("stream"):  # a judge call: {"verdict": "YES"} after the judge's delay
            judged[0] += 1
            if model.startswith("judge-"):
                await asyncio.sleep(int(model.removeprefix("judge-").removesuffix("ms")) / 1000)
            content = json.dumps({"verdict": "YES", "unsupported": []})
            return JSONResponse({"id": "j", "object": "chat.completion", "created": 0, "model": model,
                                 "choices": [{"index": 0, "finish_reason": "stop",
                                              "message": {"role": "assistant", "content": content}}],
                                 "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

        return StreamingResponse(paced_events("chat", model)(), media_type="text/event-stream")

    def paced_events(api: str, model: str):
        words = ANSWER.split(" ")
        pieces = [word + (" " if i < len(words) - 1 else "") for i, word in enumerate(words)]

        def sse(name: str | None, data: dict) -> str:
            return (f"event: {name}\n" if name else "") + "data: " + json.dumps(data) + "\n\n"

        async def chat_chunks():
            base = {"id": "chatcmpl-b", "object": "chat.completion.chunk", "created": 0, "model": model}
            yield sse(None, {**base, "choices": [{"index": 0, "delta": {"role": "assistant"}}]})
            for piece in pieces:
                await asyncio.sleep(1 / tps)
                yield sse(None, {**base, "choices": [{"index": 0, "delta": {"content": piece}}]})
            yield sse(None, {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
            yield "data: [DONE]\n\n"

        async def response_events():
            item = {"type": "message", "id": "msg_b", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": ANSWER, "annotations": []}]}
            final = {"id": "resp_b", "object": "response", "created_at": 0, "status": "completed", "model": model,
                     "output": [item], "usage": {"input_tokens": 1, "output_tokens": len(pieces),
                                                 "total_tokens": 1 + len(pieces)}}
            at = {"output_index": 0, "item_id": "msg_b", "content_index": 0}
            yield sse("response.created", {"type": "response.created", "response": {**final, "output": [],
                                                                                      "status": "in_progress"}})
            yield sse("response.output_item.added", {"type": "response.output_item.added", "output_index": 0,
                                                     "item": {**item, "content": [], "status": "in_progress"}})
            yield sse("response.content_part.added", {"type": "response.content_part.added", **at,
                                                      "part": {"type": "output_text", "text": "", "annotations": []}})
            for piece in pieces:
                await asyncio.sleep(1 / tps)
                yield sse("response.output_text.delta", {"type": "response.output_text.delta", **at,
                                                         "delta": piece})
            yield sse("response.output_text.done", {"type": "response.output_text.done", **at, "text": ANSWER})
            yield sse("response.output_item.done", {"type": "response.output_item.done", "output_index": 0,
                                                    "item": item})
            yield sse("response.completed", {"type": "response.completed", "response": final})

        async def message_events():
            message = {"id": "msg_b", "type": "message", "role": "assistant", "model": model, "content": [],
                       "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1}}
            yield sse("message_start", {"type": "message_start", "message": message})
            yield sse("content_block_start", {"type": "content_block_start", "index": 0,
                                              "content_block": {"type": "text", "text": ""}})
            for piece in pieces:
                await asyncio.sleep(1 / tps)
                yield sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                  "delta": {"type": "text_delta", "text": piece}})
            yield sse("content_block_stop", {"type": "content_block_stop", "index": 0})
            yield sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn",
                                                                           "stop_sequence": None},
                                        "usage": {"output_tokens": len(pieces)}})
            yield sse("message_stop", {"type": "message_stop"})

        return {"chat": chat_chunks, "responses": response_events, "messages": message_events}[api]

    def native(api: str):
        async def answer(request: Request) -> Response:
            body = await request.json()
            return StreamingResponse(paced_events(api, str(body.get("model", "")))(), media_type="text/event-stream")
        return answer

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": []})

    async def calls(request: Request) -> JSONResponse:
        return JSONResponse({"judge_calls": judged[0]})

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]),
                             Route("/v1/responses", native("responses"), methods=["POST"]),
                             Route("/v1/messages", native("messages"), methods=["POST"]),
                             Route("/v1/models", models, methods=["GET"]),
                             Route("/calls", calls, methods=["GET"])])


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


def start_proxy(folder: Path, upstream: str, judge: dict, detector: str, stream_mode: str = "auto",
                code: Path = ROOT) -> tuple[str, subprocess.Popen[bytes]]:
    """`morphguard serve` from the checkout `code` (this one by default) with a `block` profile."""
    config = {"judge": judge, "detector": {"name": detector},
              "proxy": {"upstream": {"base_url": upstream}, "stream_mode": stream_mode},
              "policy": {"profiles": {"general": {"action": "block", "topics": {}}},
                         "audit": {"path": str(folder / "audit.db")}}}
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = folder / "proxy.log"
    command = [sys.executable, "-m", "morphguard.cli", "serve", "--config", str(folder / "config.yaml"),
               "--port", str(port)]
    process = subprocess.Popen(command, cwd=code, env={**os.environ, "PYTHONPATH": str(code)}, stdout=log.open("wb"),
                               stderr=subprocess.STDOUT)
    wait_ready(f"http://127.0.0.1:{port}/healthz", process, log)
    return f"http://127.0.0.1:{port}/v1", process


def chat_text(data: dict) -> str:
    return "".join((c.get("delta") or {}).get("content") or "" for c in data.get("choices") or [])


def response_text(data: dict) -> str:
    return data["delta"] if data.get("type") == "response.output_text.delta" else ""


def message_text(data: dict) -> str:
    delta = data.get("delta") if data.get("type") == "content_block_delta" else None
    return delta.get("text", "") if isinstance(delta, dict) else ""


APIS = {  # path, request body, the text an event's data adds
    "chat": ("/chat/completions", {"messages": [{"role": "user", "content": QUESTION}]}, chat_text),
    "responses": ("/responses", {"input": QUESTION}, response_text),
    "messages": ("/messages", {"max_tokens": 400, "messages": [{"role": "user", "content": QUESTION}]},
                 message_text),
}


async def timed_stream(client: httpx.AsyncClient, base: str, api: str,
                       checked: bool) -> tuple[float, float, float, str]:
    """(time to first text delta, to the first sentence's last token, to the stream's end; the text)."""
    path, request, text_of = APIS[api]
    body = {"model": "paced", "stream": True, **request}
    if checked:
        body["morphguard"] = {"context": [CONTEXT]}
    started = time.perf_counter()
    first, sentence, text = None, None, []
    async with client.stream("POST", base + path, json=body,
                             headers={"Authorization": "Bearer sk-bench"}) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            content = text_of(json.loads(line[6:]))
            if content:
                first = first or time.perf_counter()
                text.append(content)
                if sentence is None and len("".join(text).rstrip()) >= len(SENTENCES[0]):
                    sentence = time.perf_counter()
    ended = time.perf_counter()
    return (first or ended) - started, (sentence or ended) - started, ended - started, "".join(text)


async def measure(direct: str, passthrough: str, proxy: str, api: str, runs: int) -> dict:
    times: dict[str, list[tuple[float, float, float]]] = {"direct": [], "passthrough": [], "checked": []}
    calls: dict[str, list[int]] = {"passthrough": [], "checked": []}  # judge calls per stream
    counter = direct.removesuffix("/v1") + "/calls"
    async with httpx.AsyncClient(timeout=120) as client:
        for warm in (passthrough, proxy):  # the first check loads what the detector needs
            await timed_stream(client, warm, api, True)
        for _ in range(runs):
            for name, base, checked in (("direct", direct, False), ("passthrough", passthrough, True),
                                        ("checked", proxy, True)):
                before = (await client.get(counter)).json()["judge_calls"]
                ttft, first_sentence, ttlt, text = await timed_stream(client, base, api, checked)
                assert text == ANSWER, f"{api} {name}: the stream was changed: {text!r}"
                times[name].append((ttft, first_sentence, ttlt))
                if name in calls:
                    calls[name].append((await client.get(counter)).json()["judge_calls"] - before)

    def median_ms(name: str, i: int) -> float:
        return round(statistics.median(t[i] for t in times[name]) * 1000, 1)

    out: dict = {name: {"ttft_ms": median_ms(name, 0), "first_sentence_ms": median_ms(name, 1),
                        "ttlt_ms": median_ms(name, 2)} for name in times}
    for name, counted in calls.items():
        out[name]["judge_calls"] = statistics.median(counted)
    # The first token leaves once the first sentence is written and checked: beyond the writing, the check's cost.
    out["added"] = {"ttft_ms": round(out["checked"]["ttft_ms"] - out["direct"]["ttft_ms"], 1),
                    "ttft_after_first_sentence_ms": round(out["checked"]["ttft_ms"]
                                                          - out["direct"]["first_sentence_ms"], 1),
                    "ttlt_ms": round(out["checked"]["ttlt_ms"] - out["direct"]["ttlt_ms"], 1),
                    "ttlt_vs_passthrough_ms": round(out["checked"]["ttlt_ms"] - out["passthrough"]["ttlt_ms"], 1)}
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
    parser.add_argument("--only", help="run this scenario alone (grounding, judge_<N>ms, embedded); the others' "
                                       "figures are kept")
    parser.add_argument("--apis", default="chat,responses,messages", help="the APIs measured, comma-separated")
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
        if args.only:
            scenarios = [s for s in scenarios if s[0] == args.only]
        results: dict = {}
        try:
            wait_ready(direct + "/models", upstream, log)
            for name, judge, detector in scenarios:
                where = folder / name
                where.mkdir()
                (where / "passthrough").mkdir()
                relayed, relaying = start_proxy(where / "passthrough", direct, judge, detector, "passthrough")
                try:
                    proxy, process = start_proxy(where, direct, judge, detector)
                except BaseException:
                    relaying.terminate()
                    raise
                results[name] = {}
                try:
                    for api in args.apis.split(","):
                        results[name][api] = measure_api = asyncio.run(measure(direct, relayed, proxy, api,
                                                                               args.runs))
                        print(f"{name:>12} {api:>9}: direct TTFT {measure_api['direct']['ttft_ms']:7.1f} ms, TTLT "
                              f"{measure_api['direct']['ttlt_ms']:7.1f} ms | passthrough TTLT "
                              f"{measure_api['passthrough']['ttlt_ms']:7.1f} ms | checked TTFT "
                              f"{measure_api['checked']['ttft_ms']:7.1f} ms, TTLT "
                              f"{measure_api['checked']['ttlt_ms']:7.1f} ms | added TTFT "
                              f"{measure_api['added']['ttft_ms']:+7.1f} ms (after the first sentence "
                              f"{measure_api['added']['ttft_after_first_sentence_ms']:+7.1f} ms), TTLT "
                              f"{measure_api['added']['ttlt_ms']:+7.1f} ms ("
                              f"{measure_api['added']['ttlt_vs_passthrough_ms']:+7.1f} ms beyond passthrough) | "
                              f"judge calls a stream: passthrough {measure_api['passthrough']['judge_calls']}, "
                              f"checked {measure_api['checked']['judge_calls']}",
                              flush=True)
                finally:
                    for started in (process, relaying):
                        started.terminate()
                        started.wait(30)
                results[name]["audit"] = audited(where / "audit.db")
                results[name]["runs"] = args.runs
        finally:
            upstream.terminate()
            upstream.wait(30)
    out = HERE / "results" / "streaming.json"
    previous = json.loads(out.read_text()) if out.exists() else {}
    previous.get("scenarios", {}).update(results)
    out.write_text(json.dumps({
        "setup": {"words_per_second": args.tps, "sentences": len(SENTENCES),
                  "words": len(ANSWER.split()), "judge_ms": args.judge_ms, "stat": "median",
                  "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared)"},
        "scenarios": {**previous.get("scenarios", {}), **results}}, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
