"""An OpenAI-compatible chat server that answers every request after a fixed delay (a stand-in provider).

Its answer is a JSON object that also reads as a valid reply to every judge prompt (factoids, statements,
verdict; to the `sentences` check's, every numbered sentence SUPPORTED), so it can serve as the judge of background
checks too. Asked to stream, it sends the same answer
as `STREAM_CHUNKS` chunks, the first after the delay and the rest at once.
`python benchmarks/fixed_upstream.py PORT MS`
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

CONTENT = json.dumps({"factoids": ["The Eiffel Tower is in Paris."], "statements": ["The tower stands in Paris."],
                      "verdict": "YES", "unsupported": []})
STREAM_CHUNKS = 20
NUMBERED = re.compile(r"^(\d+)\. ", re.M)  # a sentence the `sentences` check asks about, in its prompt's <answer>


def content(body: dict) -> str:
    """CONTENT, with a verdict for each sentence a `sentences` prompt numbers."""
    asked = body.get("messages")
    last = asked[-1] if isinstance(asked, list) and asked and isinstance(asked[-1], dict) else {}
    text = last.get("content")
    if not isinstance(text, str):
        parts = text if isinstance(text, list) else []
        text = "".join(str(part.get("text", "")) for part in parts if isinstance(part, dict))
    answer = text.partition("<answer>")[2].partition("</answer>")[0]
    numbers = NUMBERED.findall(answer)
    if not numbers:
        return CONTENT
    verdicts = [{"id": int(n), "verdict": "SUPPORTED", "phrases": []} for n in numbers]
    return json.dumps({**json.loads(CONTENT), "sentences": verdicts, "answer": "SUPPORTED"})


def chunks(model: str) -> list[bytes]:
    step = -(-len(CONTENT) // STREAM_CHUNKS)
    parts = [CONTENT[i:i + step] for i in range(0, len(CONTENT), step)]
    out = []
    for n, part in enumerate(parts):
        last = n == len(parts) - 1
        out.append(json.dumps({"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": int(time.time()),
                               "model": model, "choices": [{"index": 0, "delta": {"content": part},
                                                            "finish_reason": "stop" if last else None}]}))
    return [b"data: " + c.encode() + b"\n\n" for c in out] + [b"data: [DONE]\n\n"]


def app(latency_s: float) -> Starlette:
    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        await asyncio.sleep(latency_s)
        if body.get("stream"):
            return StreamingResponse(iter(chunks(body.get("model", "bench"))), media_type="text/event-stream")
        return JSONResponse({
            "id": "chatcmpl-bench", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", "bench"),
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": content(body)}}],
            "usage": {"prompt_tokens": 42, "completion_tokens": 24, "total_tokens": 66},
        })

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": "bench", "object": "model"}]})

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]), Route("/v1/models", models)])


if __name__ == "__main__":
    port, latency_ms = int(sys.argv[1]), float(sys.argv[2])
    uvicorn.run(app(latency_ms / 1000), host="127.0.0.1", port=port, log_level="warning", access_log=False)
