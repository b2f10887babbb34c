"""A scripted OpenAI-compatible provider, run as its own process: `python -m tests.e2e.fake_provider PORT`.

It stands in for a paid API in two roles, told apart by the request:
- the RAG model: the `model` name picks the answer ("faithful", "hallucinated", "refugee"; "echo" repeats the
  last user message, so a client can make the answer whatever it likes) or a failure ("fail-400", "fail-500",
  "slow"); a request that ends with the proxy's regeneration instruction gets
  the faithful answer;
- the judge: the `sentences` check's prompts and MetaRAG's are answered by a lexical rule (a sentence or
  statement is supported when the passages contain it word for word; `sentences` is told the runs of words the
  passages never use as its phrases), so verdicts are exact and known in advance. A sentence with
  "automatically" is unsupported while the answer as a whole is supported: `sentences` scores it between the
  sensitive topics' threshold and the general one (`tests.scripted_llm.sentences_score`). MetaRAG's statements
  with "automatically" get NOT SURE except the second
  antonym (NO): a score of exactly 0.375. The judge
  models "slow-judge" (3 s per call) and "broken-judge" (HTTP 400) make checks fail.
Faults, by model name: "rate-limited" (429 with Retry-After and x-ratelimit headers), "unavailable"
(503), "stall-body" (headers, half a body, then silence), "reset" (headers, half a body, then the
connection drops), "nan" (a NaN in the JSON), "content-int" (content 12345), "surrogate" (a lone
surrogate in the answer); streamed: "truncated" (no finish, no [DONE]), "malformed-chunk"
(`data: [1,2,3]`), "stall-stream" and "reset-stream" (silence or a dropped connection mid-stream),
"slow-stream" (a chunk every 0.5 s), "endless-stream" (a chunk every 0.2 s, never ending, plain or streamed),
"giant-line-<N>" (one SSE line of N KiB, sent in 64 KiB pieces, then the answer as usual; streamed Responses too).
"leak-key" answers 401 with OpenAI's partial echo of the key it was sent
("Incorrect API key provided: sk-upst*****cret") and "leak-key-full" with the whole key, on chat, the Responses
and Messages APIs and embeddings ("leak-key-gzip": the same 401 body gzip-encoded).
"never-answers" sends no byte until the caller leaves; GET /_inflight counts the "endless-stream" and
"never-answers" requests whose caller has not left yet.
Every chat request body is kept and served back at GET /_requests; a request to any other path is recorded
(method, path, authorization, cookie) at GET /_others, so tests can tell what reached the provider.
It also receives escalation
webhooks: POST /_webhook/ok, /_webhook/flaky (503 twice, then 200), /_webhook/down (always 503),
/_webhook/gate-NAME (503 until POST /_gate/NAME, then 200); GET /_webhooks lists what it took (200s).
Judge models "judge-<N>ms" answer as "judge" does, after N ms: a judge of fixed delay. POST /v1/responses
and /v1/messages answer in the OpenAI Responses and Anthropic Messages shapes (streamed as their SSE
events), picking the answer by model as chat does ("echo" repeats the last input's text); GET /_native lists
what they received.
Answers in every field that carries a model's words, by model name "<field>-answer" (the hallucinated answer) or
"<field>-echo" (the last user message, as "echo"): "tool" (a tool call's argument, on all three APIs, streamed as
argument deltas), "function" (chat: the legacy `function_call`), "refusal" (chat's `refusal`, a Responses refusal
part), "audio" (chat: an audio transcript, streamed as transcript deltas; a Responses stream: transcript deltas and
the sound, a response that holds neither), "parts" (chat: content as a list of text parts, streamed so too),
"output-parts" (chat: as "parts", of the Responses API's `output_text` type), "done-only" (a Responses stream whose
text comes only in `response.output_text.done`), "item-only" (only in `response.output_item.done`), "start-only" (a
Messages stream whose text block starts holding the text); "image" (Responses: only an image), "image-first" and
"image-last" (Responses: an image, then the text message, or the other way round). Chat answers carry
logprobs when asked for them.
"two-choices" answers with two choices, the faithful answer first and the hallucinated one second (chat, streamed
too, and POST /v1/completions, the legacy text completions API, which answers by model as chat does).
Responses are stored under ids of their own: `previous_response_id` of a stored one with "repeat" in the
input answers with that response's text again, an unknown id is a 400 as OpenAI's; "truncated" streams
of Responses and Messages stop before their last event.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import re
import sys
import time

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.scripted_llm import asked_sentences, lexical_label, sentences_reply, tag

ANSWERS = {
    "faithful": "Ibuprofen is contraindicated in the third trimester of pregnancy.",
    "hallucinated": "Ibuprofen is safe throughout pregnancy.",
    "refugee": "Refugees automatically receive protection.",
}
REGENERATE_MARK = "Answer again using only the retrieved context"
webhooks: list[dict] = []
received: list[dict] = []
others: list[dict] = []
attempts: dict[str, int] = {}
inflight: dict[str, int] = {"endless-stream": 0, "never-answers": 0}  # requests whose caller is still there
opened: set[str] = set()  # webhooks /_webhook/gate-NAME answer 503 until POST /_gate/NAME


def _tag(text: str, tag: str) -> str:
    match = re.search(rf"<{tag}>\n?(.*?)\n?</{tag}>", text, re.S)
    return match.group(1).strip() if match else ""


def _sentences(user: str) -> str:
    passages = tag(user, "passages")
    whole = "UNSUPPORTED" if any(lexical_label(s, passages)[0] == "UNSUPPORTED"
                                 for _, s in asked_sentences(user) if "automatically" not in s) else "SUPPORTED"
    return sentences_reply(user, lexical_label, whole)


def _judge(system: str, user: str) -> str | None:
    if "sentences are numbered" in system:
        return _sentences(user)
    if "atomic factoids" in system:
        return json.dumps({"factoids": [_tag(user, "answer")]})
    if "paraphrases" in system:
        return json.dumps({"statements": [f"S{i}: {_tag(user, 'statement')}" for i in (1, 2)]})
    if "contradictions" in system:
        return json.dumps({"statements": [f"A{i}: {_tag(user, 'statement')}" for i in (1, 2)]})
    if "reference passages" in system:
        statement = _tag(user, "statement")
        if "automatically" in statement:
            return json.dumps({"verdict": "NO" if statement.startswith("A2") else "NOT SURE"})
        claim = re.sub(r"^[SA]\d: ", "", statement).rstrip(".").lower()
        supported = claim in _tag(user, "passages").lower()
        if statement.startswith("A"):
            supported = not supported
        return json.dumps({"verdict": "YES" if supported else "NO", "reason": "lexical rule"})
    return None


_PART_TYPES = {"parts": "text", "output-parts": "output_text"}  # the type of a chat answer's content parts


def _field(model: str) -> str:
    """The field a "<field>-answer" or "<field>-echo" model answers in ("" for the plain text)."""
    match = re.fullmatch(r"(.+)-(answer|echo)", model)
    return match.group(1) if match else ""


def _text(model: str, echoed: str) -> str:
    if model == "echo" or model.endswith("-echo"):
        return echoed
    return ANSWERS["hallucinated"] if model.endswith("-answer") else ANSWERS.get(model, ANSWERS["faithful"])


def _completion(model: str, text: str, logprobs: bool = False) -> dict:
    message: dict = {"role": "assistant", "content": text}
    finish = "stop"
    shape = _field(model)
    if shape == "tool":
        message = {"role": "assistant", "content": None, "tool_calls": [_tool_call(text)]}
        finish = "tool_calls"
    elif shape == "function":  # the legacy single call, to a request that offers `functions`
        message = {"role": "assistant", "content": None, "function_call": _tool_call(text)["function"]}
        finish = "function_call"
    elif shape == "refusal":
        message = {"role": "assistant", "content": None, "refusal": text}
    elif shape in ("parts", "output-parts"):
        message = {"role": "assistant", "content": [{"type": _PART_TYPES[shape], "text": text}]}
    elif shape == "audio":
        message = {"role": "assistant", "content": None,
                   "audio": {"id": "audio_1", "data": "UklGRg==", "expires_at": 0, "transcript": text}}
    choice = {"index": 0, "message": message, "finish_reason": finish,
              "logprobs": {"content": [{"token": w, "logprob": -0.1, "bytes": None, "top_logprobs": []}
                                       for w in _words(text)]} if logprobs else None}
    choices = [choice]
    if model == "two-choices":  # n = 2: the grounded answer first, the ungrounded one second
        choice["message"]["content"] = ANSWERS["faithful"]
        choices.append({**choice, "index": 1, "message": {"role": "assistant", "content": ANSWERS["hallucinated"]}})
    return {"id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": choices, "usage": {"prompt_tokens": 20, "completion_tokens": 9, "total_tokens": 29},
            "system_fingerprint": "fp_fake_unknown_field_kept"}


def _tool_call(text: str) -> dict:
    arguments = json.dumps({"answer": text})
    return {"id": "call_1", "type": "function", "function": {"name": "answer", "arguments": arguments}}


def _lenient(handler):
    """As a real provider does: odd input is the client's error, never a 500."""
    async def answer(request: Request) -> Response:
        try:
            return await handler(request)
        except Exception as exc:
            return JSONResponse({"error": {"message": f"cannot read the request: {type(exc).__name__}",
                                           "type": "invalid_request_error", "param": None, "code": None}},
                                status_code=400)
    return answer


@_lenient
async def chat(request: Request) -> Response:
    return await _chat(request)


async def _chat(request: Request) -> Response:
    body = json.loads(await request.body())
    received.append({"body": body, "authorization": request.headers.get("authorization"),
                     "cookie": request.headers.get("cookie")})
    messages = body["messages"]
    system = messages[0]["content"] if messages[0]["role"] == "system" else ""
    judged = _judge(system if isinstance(system, str) else "", messages[-1].get("content") or "")
    model = body.get("model", "")
    leaked = _leak(model, request)
    if leaked is not None:
        return leaked
    if model == "slow-judge":
        await asyncio.sleep(3)
    delay = re.fullmatch(r"judge-(\d+)ms", model)
    if delay:  # a judge with a fixed delay per call, for throughput measurements
        await asyncio.sleep(int(delay.group(1)) / 1000)
    if judged is not None:
        if model == "broken-judge":
            return JSONResponse({"error": {"message": "judge rejected", "type": "invalid_request_error"}},
                                status_code=400)
        return JSONResponse(_completion(model, judged))
    if REGENERATE_MARK in str(messages[-1].get("content")):
        return JSONResponse(_completion(model, ANSWERS["faithful"]))
    if model == "fail-400":
        return JSONResponse({"error": {"message": "model rejected", "type": "invalid_request_error",
                                       "param": "model", "code": "model_not_found"}}, status_code=400)
    if model == "fail-500":
        return JSONResponse({"error": {"message": "boom", "type": "server_error"}}, status_code=500)
    if model == "flaky":  # fails twice, then answers
        attempts["flaky"] = attempts.get("flaky", 0) + 1
        if attempts["flaky"] <= 2:
            return JSONResponse({"error": {"message": "try again", "type": "server_error"}}, status_code=503)
    if model == "slow":
        await asyncio.sleep(5)
    if model == "never-answers":
        return await _never_answers(request)
    fault = _fault(model, bool(body.get("stream")))
    if fault is not None:
        return fault
    text = _text(model, str(messages[-1].get("content")))
    if not body.get("stream"):
        return JSONResponse(_completion(model, text, logprobs=bool(body.get("logprobs"))))
    return StreamingResponse(_chunks(model, text), media_type="text/event-stream")


async def _chunks(model: str, text: str, finish: bool = True, broken: str = ""):
    base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": int(time.time()), "model": model}
    yield "data: " + json.dumps({**base, "choices": [{"index": 0, "delta": {"role": "assistant"}}]}) + "\n\n"
    if model == "two-choices":  # n = 2, streamed: the grounded answer as choice 0, the ungrounded one as choice 1
        for index, answer in enumerate((ANSWERS["faithful"], ANSWERS["hallucinated"])):
            for word in re.findall(r"\S+\s*", answer):
                piece = {"index": index, "delta": {"content": word}}
                yield "data: " + json.dumps({**base, "choices": [piece]}) + "\n\n"
            yield "data: " + json.dumps({**base, "choices": [{"index": index, "delta": {}, "finish_reason": "stop"}]})
            yield "\n\n"
        yield "data: [DONE]\n\n"
        return
    if _field(model) == "tool":  # the call's name first, then its arguments in two pieces
        call = _tool_call(text)
        arguments = call["function"]["arguments"]
        head = {"index": 0, "id": call["id"], "type": "function", "function": {"name": "answer", "arguments": ""}}
        for delta in (head, {"index": 0, "function": {"arguments": arguments[:10]}},
                      {"index": 0, "function": {"arguments": arguments[10:]}}):
            yield "data: " + json.dumps({**base, "choices": [{"index": 0, "delta": {"tool_calls": [delta]}}]}) + "\n\n"
        yield "data: " + json.dumps({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
        yield "\n\ndata: [DONE]\n\n"
        return
    if _field(model) == "function":  # the legacy call: its name first, then its arguments in two pieces
        arguments = _tool_call(text)["function"]["arguments"]
        for call in ({"name": "answer", "arguments": ""}, {"arguments": arguments[:10]}, {"arguments": arguments[10:]}):
            yield "data: " + json.dumps({**base, "choices": [{"index": 0, "delta": {"function_call": call}}]}) + "\n\n"
        yield "data: " + json.dumps({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "function_call"}]})
        yield "\n\ndata: [DONE]\n\n"
        return
    for i, word in enumerate(re.findall(r"\S+\s*", text)):
        if i == 2 and broken == "malformed":
            yield "data: [1,2,3]\n\n"
        if i == 2 and broken == "stall":
            await asyncio.sleep(30)
        if i == 2 and broken == "reset":
            raise ConnectionResetError("scripted reset")
        if broken == "slow":
            await asyncio.sleep(0.5)
        delta: dict = {"content": word}  # or the words in another field alone, a piece at a time
        if _field(model) == "refusal":
            delta = {"refusal": word}
        elif _field(model) == "audio":
            delta = {"audio": {"id": "audio_1", "transcript": word}}
        elif _field(model) in _PART_TYPES:
            delta = {"content": [{"type": _PART_TYPES[_field(model)], "text": word}]}
        yield "data: " + json.dumps({**base, "choices": [{"index": 0, "delta": delta}]}) + "\n\n"
        await asyncio.sleep(0.01)
    if _field(model) == "audio":  # the sound itself, after its transcript
        audio = {"id": "audio_1", "data": "UklGRg==", "expires_at": 0}
        yield "data: " + json.dumps({**base, "choices": [{"index": 0, "delta": {"audio": audio}}]}) + "\n\n"
    if finish:
        yield "data: " + json.dumps({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}) + "\n\n"
        yield "data: [DONE]\n\n"


def _leak(model: str, request: Request) -> Response | None:
    """A 401 that echoes the key it was sent, as OpenAI's does (partly) or a careless provider (whole)."""
    if model not in ("leak-key", "leak-key-full", "leak-key-gzip"):
        return None
    key = request.headers.get("authorization", "").removeprefix("Bearer ") or request.headers.get("x-api-key", "")
    shown = key if model == "leak-key-full" else f"{key[:7]}{'*' * 5}{key[-4:]}"
    body = json.dumps({"error": {"message": f"Incorrect API key provided: {shown}. You can find your API key at "
                                            "https://platform.openai.com/account/api-keys.",
                                 "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}})
    if model == "leak-key-gzip":
        return Response(gzip.compress(body.encode()), 401, media_type="application/json",
                        headers={"content-encoding": "gzip"})
    return Response(body, 401, media_type="application/json")


def _pad(kib: int):
    """`kib` KiB of padding, in pieces of 64 KiB."""
    for start in range(0, kib, 64):
        yield "x" * 1024 * min(64, kib - start)


async def _giant_line(model: str, kib: int):
    """The role chunk, one chunk line of `kib` KiB (no choices, a long unknown field), then the answer."""
    base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": int(time.time()), "model": model}
    yield "data: " + json.dumps({**base, "choices": [{"index": 0, "delta": {"role": "assistant"}}]}) + "\n\n"
    yield "data: " + json.dumps({**base, "choices": []})[:-1] + ', "pad": "'
    for piece in _pad(kib):
        yield piece
    yield '"}\n\n'
    async for line in _chunks(model, ANSWERS["faithful"]):
        yield line


async def _never_answers(request: Request) -> Response:
    inflight["never-answers"] += 1
    try:
        while not await request.is_disconnected():
            await asyncio.sleep(0.05)
    finally:
        inflight["never-answers"] -= 1
    return Response(status_code=499)


async def _endless(model: str):
    inflight["endless-stream"] += 1
    try:
        base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": int(time.time()), "model": model}
        while True:
            yield "data: " + json.dumps({**base, "choices": [{"index": 0, "delta": {"content": "more "}}]}) + "\n\n"
            await asyncio.sleep(0.2)
    finally:
        inflight["endless-stream"] -= 1


def _fault(model: str, stream: bool) -> Response | None:
    if model == "endless-stream":
        return StreamingResponse(_endless(model), media_type="text/event-stream")
    giant = re.fullmatch(r"giant-line-(\d+)", model)
    if stream and giant:
        return StreamingResponse(_giant_line(model, int(giant.group(1))), media_type="text/event-stream")
    if model == "redirect":  # a provider (or whoever answers for it) pointing the call elsewhere
        return Response(status_code=307, headers={"location": "/stolen/v1/chat/completions"})
    if model == "set-cookie":
        return JSONResponse(_completion(model, ANSWERS["faithful"]), headers={"set-cookie": "session=of-one-client"})
    if model == "rate-limited":
        return JSONResponse({"error": {"message": "slow down", "type": "rate_limit_error", "code": "rate_limit"}},
                            status_code=429, headers={"retry-after": "0", "x-ratelimit-remaining-requests": "0"})
    if model == "unavailable":
        return JSONResponse({"error": {"message": "busy", "type": "server_error"}}, status_code=503,
                            headers={"retry-after": "0"})
    if model in ("nan", "content-int", "surrogate"):
        text = {"nan": '"ok", "score": NaN', "content-int": "12345", "surrogate": '"half \\ud800 a pair"'}[model]
        raw = json.dumps(_completion(model, "PLACEHOLDER")).replace('"PLACEHOLDER"', text)
        return Response(raw, media_type="application/json")
    if model in ("stall-body", "reset"):
        async def half():
            yield json.dumps(_completion(model, ANSWERS["faithful"]))[:40]
            if model == "stall-body":
                await asyncio.sleep(30)
            raise ConnectionResetError("scripted reset")
        return StreamingResponse(half(), media_type="application/json")
    if stream and model in ("truncated", "malformed-chunk", "stall-stream", "reset-stream", "slow-stream"):
        broken = {"malformed-chunk": "malformed", "stall-stream": "stall", "reset-stream": "reset",
                  "slow-stream": "slow"}.get(model, "")
        return StreamingResponse(_chunks(model, ANSWERS["hallucinated"], finish=model != "truncated", broken=broken),
                                 media_type="text/event-stream")
    return None


async def models(request: Request) -> Response:
    return JSONResponse({"object": "list", "data": [{"id": m, "object": "model", "created": 0, "owned_by": "fake"}
                                                    for m in ("faithful", "hallucinated")]})


async def embeddings(request: Request) -> Response:
    body = json.loads(await request.body())
    leaked = _leak(body.get("model", "") if isinstance(body, dict) else "", request)
    if leaked is not None:
        return leaked
    if not isinstance(body, dict) or "input" not in body:
        return JSONResponse({"error": {"message": "'input' is required", "type": "invalid_request_error",
                                       "param": "input", "code": None}}, status_code=400)
    inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
    return JSONResponse({"object": "list", "model": body.get("model"), "usage": {"prompt_tokens": 3, "total_tokens": 3},
                         "data": [{"object": "embedding", "index": i, "embedding": [0.1, 0.2, float(len(t))]}
                                  for i, t in enumerate(inputs)]})


async def text_completions(request: Request) -> Response:
    """The legacy completions API: `choices[i].text`, picked by model as chat does ("two-choices" too)."""
    body = json.loads(await request.body())
    model = body.get("model", "")
    native_received.append({"path": "completions", "body": body, "headers": dict(request.headers)})
    texts = [ANSWERS["faithful"], ANSWERS["hallucinated"]] if model == "two-choices" else [
        ANSWERS.get(model, ANSWERS["faithful"])]
    return JSONResponse({"id": "cmpl-fake", "object": "text_completion", "created": int(time.time()), "model": model,
                         "choices": [{"index": i, "text": t, "logprobs": None, "finish_reason": "stop"}
                                     for i, t in enumerate(texts)],
                         "usage": {"prompt_tokens": 20, "completion_tokens": 9, "total_tokens": 29}})


async def requests_seen(request: Request) -> Response:
    # ASCII escapes: fuzzed bodies carry lone surrogates, which UTF-8 (JSONResponse) cannot encode
    return Response(json.dumps(received), media_type="application/json")


# --- the Responses API and the Anthropic Messages API, answering as the chat route does ---------------------

native_received: list[dict] = []


def _words(text: str) -> list[str]:
    return re.findall(r"\S+\s*", text)


stored: dict[str, str] = {}  # response id → its text, for previous_response_id


def _response(model: str, text: str) -> dict:
    number = len(stored) + 1
    output: list[dict] = [{"type": "message", "id": f"msg_{number}", "status": "completed", "role": "assistant",
                           "content": [{"type": "output_text", "text": text, "annotations": []}]}]
    if _field(model) == "tool":
        output = [{"type": "function_call", "id": f"fc_{number}", "call_id": "call_1", "name": "answer",
                   "arguments": json.dumps({"answer": text}), "status": "completed"}]
    elif _field(model) == "refusal":
        output[0]["content"] = [{"type": "refusal", "refusal": text}]
    elif _field(model) == "image":
        output = [_image(number)]
    elif _field(model) == "audio":  # spoken: the words only in the stream's transcript events
        output = []
    elif _field(model) == "image-first":
        output = [_image(number), *output]
    elif _field(model) == "image-last":
        output = [*output, _image(number)]
    stored[f"resp_{number}"] = text
    return {"id": f"resp_{number}", "object": "response", "created_at": int(time.time()), "status": "completed",
            "model": model, "output": output,
            "usage": {"input_tokens": 20, "output_tokens": 9, "total_tokens": 29},
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}


def _image(number: int) -> dict:
    return {"type": "image_generation_call", "id": f"ig_{number}", "status": "completed", "result": "iVBORw0K"}


@_lenient
async def responses(request: Request) -> Response:
    body = json.loads(await request.body())
    native_received.append({"path": "responses", "body": body, "headers": dict(request.headers)})
    model = body.get("model", "")
    leaked = _leak(model, request)
    if leaked is not None:
        return leaked
    if model == "fail-400":
        return JSONResponse({"error": {"message": "model rejected", "type": "invalid_request_error",
                                       "param": "model", "code": "model_not_found"}}, status_code=400)
    previous = body.get("previous_response_id")
    if previous is not None and previous not in stored:
        return JSONResponse({"error": {"message": f"Previous response with id '{previous}' not found.",
                                       "type": "invalid_request_error", "param": "previous_response_id",
                                       "code": "previous_response_not_found"}}, status_code=400)
    text = _text(model, _echoed(body.get("input")))
    if previous is not None and "repeat" in json.dumps(body.get("input")):
        text = stored[previous]
    final = _response(model, text)
    if not body.get("stream"):
        return JSONResponse(final)

    async def events():
        seq = 0

        def event(name: str, **data: object) -> str:
            nonlocal seq
            seq += 1
            return f"event: {name}\ndata: {json.dumps({'type': name, 'sequence_number': seq, **data})}\n\n"

        yield event("response.created", response={**final, "status": "in_progress", "output": []})
        giant = re.fullmatch(r"giant-line-(\d+)", model)
        if giant:  # an event the client would skip, of one long data line
            yield 'event: response.in_progress\ndata: {"type": "response.in_progress", "pad": "'
            for piece in _pad(int(giant.group(1))):
                yield piece
            yield '"}\n\n'
        for index, item in enumerate(final["output"]):
            async for line in _item_events(event, model, index, item):
                yield line
        if _field(model) == "audio":
            for word in _words(text):
                yield event("response.audio.transcript.delta", delta=word)
            yield event("response.audio.delta", delta="UklGRg==")
            yield event("response.audio.transcript.done")
            yield event("response.audio.done")
        if model != "truncated":
            yield event("response.completed", response=final)
    return StreamingResponse(events(), media_type="text/event-stream")


async def _item_events(event, model: str, index: int, item: dict):
    """The events of one output item of a Responses stream."""
    if item["type"] == "function_call":  # the call opens empty, its arguments follow in two pieces
        yield event("response.output_item.added", output_index=index, item={**item, "arguments": "",
                                                                            "status": "in_progress"})
        for piece in (item["arguments"][:10], item["arguments"][10:]):
            yield event("response.function_call_arguments.delta", output_index=index, item_id=item["id"],
                        delta=piece)
        yield event("response.function_call_arguments.done", output_index=index, item_id=item["id"],
                    arguments=item["arguments"])
        yield event("response.output_item.done", output_index=index, item=item)
        return
    if item["type"] != "message":  # an image: its item whole (after a text, once that text could be checked)
        if index:
            await asyncio.sleep(0.5)
        yield event("response.output_item.added", output_index=index, item=item)
        yield event("response.output_item.done", output_index=index, item=item)
        return
    part = item["content"][0]
    kind, key = ("refusal", "refusal") if part["type"] == "refusal" else ("output_text", "text")
    text = part[key]
    yield event("response.output_item.added", output_index=index, item={**item, "content": [],
                                                                        "status": "in_progress"})
    if _field(model) != "item-only":  # there the text comes only with the whole item
        at = {"output_index": index, "item_id": item["id"], "content_index": 0}
        yield event("response.content_part.added", **at, part={**part, key: ""})
        if _field(model) != "done-only":  # there the text comes only with `output_text.done`
            for word in _words(text):
                yield event(f"response.{kind}.delta", **at, delta=word,
                            **({"logprobs": []} if kind == "output_text" else {}))
        if kind == "refusal":
            yield event("response.refusal.done", **at, refusal=text)
        else:
            yield event("response.output_text.done", **at, text=text, logprobs=[])
        yield event("response.content_part.done", **at, part=part)
    yield event("response.output_item.done", output_index=index, item=item)


def _echoed(given: object) -> str:
    """The text of a Responses `input` or of the last of Messages' `messages` (a string or text parts)."""
    if isinstance(given, list):
        given = given[-1].get("content") if given and isinstance(given[-1], dict) else ""
    if isinstance(given, list):
        return "".join(p.get("text", "") for p in given if isinstance(p, dict))
    return given if isinstance(given, str) else ""


def _message(model: str, text: str) -> dict:
    if _field(model) == "tool":
        return {"id": "msg_fake", "type": "message", "role": "assistant", "model": model,
                "content": [{"type": "tool_use", "id": "toolu_1", "name": "answer", "input": {"answer": text}}],
                "stop_reason": "tool_use", "stop_sequence": None, "usage": {"input_tokens": 20, "output_tokens": 9}}
    return {"id": "msg_fake", "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": 20, "output_tokens": 9}}


@_lenient
async def messages(request: Request) -> Response:
    body = json.loads(await request.body())
    native_received.append({"path": "messages", "body": body, "headers": dict(request.headers)})
    model = body.get("model", "")
    leaked = _leak(model, request)
    if leaked is not None:
        return leaked
    text = _text(model, _echoed(body.get("messages")))
    final = _message(model, text)
    if not body.get("stream"):
        return JSONResponse(final)

    async def events():
        def event(name: str, **data: object) -> str:
            return f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n"

        yield event("message_start", message={**final, "content": [], "stop_reason": None,
                                              "usage": {"input_tokens": 20, "output_tokens": 1}})
        block = final["content"][0]
        if block["type"] == "tool_use":
            yield event("content_block_start", index=0, content_block={**block, "input": {}})
            arguments = json.dumps(block["input"])
            for piece in (arguments[:10], arguments[10:]):
                yield event("content_block_delta", index=0, delta={"type": "input_json_delta", "partial_json": piece})
        elif _field(model) == "start-only":  # the block starts holding its whole text, no delta follows
            yield event("content_block_start", index=0, content_block=block)
        else:
            yield event("content_block_start", index=0, content_block={"type": "text", "text": ""})
            yield event("ping")
            for word in _words(block["text"]):
                yield event("content_block_delta", index=0, delta={"type": "text_delta", "text": word})
        yield event("content_block_stop", index=0)
        yield event("message_delta", delta={"stop_reason": final["stop_reason"], "stop_sequence": None},
                    usage={"output_tokens": 9})
        if model != "truncated":
            yield event("message_stop")
    return StreamingResponse(events(), media_type="text/event-stream")


async def native_seen(request: Request) -> Response:
    return Response(json.dumps(native_received), media_type="application/json")  # ASCII escapes, as requests_seen


async def webhook(request: Request) -> Response:
    kind = request.path_params["kind"]
    key = f"webhook-{kind}"  # apart from the chat model "flaky"'s own count
    attempts[key] = attempts.get(key, 0) + 1
    closed = kind.startswith("gate-") and kind not in opened
    if kind == "down" or closed or (kind == "flaky" and attempts[key] <= 2):
        return JSONResponse({"error": "unavailable"}, status_code=503)
    webhooks.append({"kind": kind, "attempt": attempts[key], "body": json.loads(await request.body())})
    return JSONResponse({"ok": True})


async def open_gate(request: Request) -> Response:
    opened.add("gate-" + request.path_params["name"])
    return JSONResponse({"ok": True})


async def webhooks_seen(request: Request) -> Response:
    return JSONResponse(webhooks)


async def anything(request: Request) -> Response:
    others.append({"method": request.method, "path": request.url.path,
                   "authorization": request.headers.get("authorization"), "cookie": request.headers.get("cookie")})
    return JSONResponse({"reached": request.url.path})


app = Starlette(routes=[
    Route("/v1/chat/completions", chat, methods=["POST"]),
    Route("/v1/models", models),
    Route("/v1/embeddings", embeddings, methods=["POST"]),
    Route("/v1/completions", text_completions, methods=["POST"]),
    Route("/v1/responses", responses, methods=["POST"]),
    Route("/v1/messages", messages, methods=["POST"]),
    Route("/_native", native_seen),
    Route("/_requests", requests_seen),
    Route("/_webhook/{kind}", webhook, methods=["POST"]),
    Route("/_webhooks", webhooks_seen),
    Route("/_gate/{name}", open_gate, methods=["POST"]),
    Route("/_others", lambda request: JSONResponse(others)),
    Route("/_inflight", lambda request: JSONResponse(inflight)),
    Route("/{path:path}", anything, methods=["GET", "POST", "PUT", "PATCH", "DELETE"]),
])

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
