"""Scripted verifier servers that follow the documented requests and replies of Hugging Face Text Embeddings
Inference and vLLM's pooling endpoints, run as their own process: `python -m tests.llm.fake_verifiers PORT`.

- POST /tei/predict (TEI's `/predict`): `{"inputs", "raw_scores", "truncate", "truncation_direction"}`; `inputs` is
  one sequence or a list of them, a sequence being a text or a pair [text, text] (a list of two texts is one pair).
  The reply is, per sequence, every label with its probability, highest first: `[{"label", "score"}, ...]` for one,
  a list of those for a batch. A body of another shape is a 422 `{"error", "error_type": "validation"}`.
- POST /vllm/classify (vLLM's `/classify`): `{"model", "input": text | [text, ...], "truncate_prompt_tokens", ...}`;
  the reply `{"id", "object": "list", "created", "model", "data": [{"index", "label", "probs", "num_classes"}],
  "usage"}`. A model it does not serve is a 404 in vLLM's error shape.
- POST /vllm/score (vLLM's `/score`): `{"model", "text_1", "text_2", "truncate_prompt_tokens", ...}`, text_1 one text
  or as many as text_2; the reply's `data` is `[{"index", "object": "score", "score"}]`.

The served model's rule is the tiny ONNX claim classifier's (tests/verifier_models.py): a hypothesis is supported
(0.88) when each of its words occurs in the premise, else not (0.12); a single text is read as "Premise: ...
Hypothesis: ..." (the template the tests configure). POST /_script queues failures for the next requests (a status,
or a delay in seconds); GET /_seen lists the bodies received, the most requests seen in flight at once and the
connections they came on. What
such fakes cannot show: the servers' real models, batching limits and error texts beyond what is documented.
"""

from __future__ import annotations

import asyncio
import re
import sys
import time

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

MODEL = "tiny-verifier"
TEI_FIELDS = {"inputs", "raw_scores", "truncate", "truncation_direction"}
VLLM_FIELDS = {"model", "input", "text_1", "text_2", "truncate_prompt_tokens", "user", "priority",
               "additional_data", "activation", "request_id", "encoding_format"}
WORD = re.compile(r"\w+")
seen: list[dict] = []
script: list[dict] = []
flight = {"now": 0, "most": 0}
connections: set[int] = set()  # the client ports requests came from: one per connection


def supported(premise: str, hypothesis: str) -> float:
    known = set(WORD.findall(premise.lower()))
    return 0.88 if set(WORD.findall(hypothesis.lower())) <= known else 0.12


def of_text(text: str) -> float:
    premise, _, hypothesis = text.partition("Hypothesis:")
    return supported(premise.removeprefix("Premise:"), hypothesis)


def is_sequence(value: object) -> bool:
    return isinstance(value, str) or (isinstance(value, list) and len(value) == 2
                                      and all(isinstance(v, str) for v in value))


async def scripted(route: str, body: object) -> Response | None:
    """Record the request; the next scripted failure, if one is queued."""
    seen.append({"route": route, "body": body})
    if script:
        step = script.pop(0)
        if "delay" in step:
            await asyncio.sleep(step["delay"])
        if "status" in step:
            return JSONResponse({"error": "scripted", "error_type": "overloaded"}, status_code=step["status"])
    return None


async def in_flight(handler, request: Request) -> Response:
    if request.client is not None:
        connections.add(request.client.port)
    flight["now"] += 1
    flight["most"] = max(flight["most"], flight["now"])
    try:
        await asyncio.sleep(0.05)  # long enough for requests sent together to overlap
        return await handler(request)
    finally:
        flight["now"] -= 1


async def tei_predict(request: Request) -> Response:
    body = await request.json()
    failed = await scripted("tei", body)
    if failed is not None:
        return failed
    inputs = body.get("inputs") if isinstance(body, dict) else None
    if not isinstance(body, dict) or set(body) - TEI_FIELDS or inputs is None:
        return JSONResponse({"error": "invalid body", "error_type": "validation"}, status_code=422)
    single = is_sequence(inputs)
    batch = [inputs] if single else inputs
    if not isinstance(batch, list) or not batch or not all(is_sequence(s) for s in batch):
        return JSONResponse({"error": "inputs must be sequences", "error_type": "validation"}, status_code=422)
    rows = []
    for sequence in batch:
        p = supported(*sequence) if isinstance(sequence, list) else of_text(sequence)
        rows.append(sorted([{"label": "entailment", "score": p}, {"label": "not_entailment", "score": 1 - p}],
                           key=lambda r: -r["score"]))
    return JSONResponse(rows[0] if single else rows)


def vllm_error(message: str, status: int) -> JSONResponse:
    kind = "NotFoundError" if status == 404 else "BadRequestError"
    return JSONResponse({"object": "error", "message": message, "type": kind, "param": None, "code": status},
                        status_code=status)


def vllm_reply(kind: str, data: list[dict], tokens: int) -> JSONResponse:
    return JSONResponse({"id": f"{kind}-1", "object": "list", "created": int(time.time()), "model": MODEL,
                         "data": data, "usage": {"prompt_tokens": tokens, "total_tokens": tokens,
                                                 "completion_tokens": 0, "prompt_tokens_details": None}})


def vllm_problem(body: object) -> JSONResponse | None:
    if not isinstance(body, dict) or set(body) - VLLM_FIELDS:
        return vllm_error("invalid request", 400)
    if body.get("model") not in (None, MODEL):
        return vllm_error(f"The model `{body.get('model')}` does not exist.", 404)
    return None


async def vllm_classify(request: Request) -> Response:
    body = await request.json()
    failed = await scripted("classify", body) or vllm_problem(body)
    if failed is not None:
        return failed
    texts = body.get("input")
    texts = [texts] if isinstance(texts, str) else texts
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        return vllm_error("input must be a text or a list of texts", 400)
    data = []
    for i, text in enumerate(texts):
        p = of_text(text)
        data.append({"index": i, "label": "supported" if p > 0.5 else "unsupported", "probs": [1 - p, p],
                     "num_classes": 2})
    return vllm_reply("classify", data, sum(len(t.split()) for t in texts))


async def vllm_score(request: Request) -> Response:
    body = await request.json()
    failed = await scripted("score", body) or vllm_problem(body)
    if failed is not None:
        return failed
    first, second = body.get("text_1"), body.get("text_2")
    first = [first] if isinstance(first, str) else first
    second = [second] if isinstance(second, str) else second
    if not isinstance(first, list) or not isinstance(second, list) or not second:
        return vllm_error("text_1 and text_2 must be texts or lists of texts", 400)
    if len(first) == 1:
        first = first * len(second)
    if len(first) != len(second):
        return vllm_error("text_1 and text_2 must have the same length", 400)
    data = [{"index": i, "object": "score", "score": supported(a, b)}
            for i, (a, b) in enumerate(zip(first, second, strict=True))]
    return vllm_reply("score", data, sum(len(t.split()) for t in first + second))


async def queue_script(request: Request) -> Response:
    script.extend(await request.json())
    return JSONResponse({"queued": len(script)})


async def list_seen(request: Request) -> Response:
    return JSONResponse({"requests": seen, "most_in_flight": flight["most"], "connections": len(connections)})


async def reset(request: Request) -> Response:
    seen.clear()
    script.clear()
    connections.clear()
    flight["most"] = 0
    return JSONResponse({})


def app() -> Starlette:
    def timed(handler):
        async def endpoint(request: Request) -> Response:
            return await in_flight(handler, request)
        return endpoint

    return Starlette(routes=[
        Route("/tei/predict", timed(tei_predict), methods=["POST"]),
        Route("/vllm/classify", timed(vllm_classify), methods=["POST"]),
        Route("/vllm/score", timed(vllm_score), methods=["POST"]),
        Route("/_script", queue_script, methods=["POST"]),
        Route("/_seen", list_seen),
        Route("/_reset", reset, methods=["POST"]),
    ])


if __name__ == "__main__":
    uvicorn.run(app(), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
