"""A scripted OpenAI-compatible provider for trying the fleet offline (compose and Kubernetes examples).

It answers a chat completion from the request's own retrieved context: the first sentence of its first
<context> block, which the passages support. A question that says "careless" gets an answer the passages do not
support, so the guard has something to flag. It runs on the morphguard image's Python (Starlette, uvicorn):
`python3 scripted_upstream.py [PORT]`. Replace it with your provider's URL (`proxy.upstream.base_url`).
"""

from __future__ import annotations

import re
import sys
import time
import uuid

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

UNSUPPORTED = "Yes, it is completely safe at every stage, and the clinic opens every Sunday at 6 am."


def answer(messages: list[dict]) -> str:
    text = "\n".join(m["content"] for m in messages if isinstance(m.get("content"), str))
    question = next((m["content"] for m in reversed(messages)
                     if m.get("role") == "user" and isinstance(m.get("content"), str)), "")
    if "careless" in question.lower():
        return UNSUPPORTED
    found = re.search(r"<context>(.*?)</context>", text, re.S)
    if found is None:
        return "I have no passages to answer from."
    first = re.split(r"(?<=[.!?])\s+", found.group(1).strip(), maxsplit=1)[0]
    return first or "The passages are empty."


async def chat(request: Request) -> JSONResponse:
    body = await request.json()
    content = answer(body.get("messages") or [])
    return JSONResponse({
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion", "created": int(time.time()),
        "model": body.get("model", "scripted"),
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": 50, "completion_tokens": len(content.split()), "total_tokens": 50},
    })


async def models(request: Request) -> JSONResponse:
    return JSONResponse({"object": "list", "data": [{"id": "scripted", "object": "model"}]})


app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]), Route("/v1/models", models)])

if __name__ == "__main__":
    uvicorn.run(app, host="0.0.0.0", port=int(sys.argv[1]) if len(sys.argv) > 1 else 9000, log_level="warning")
