"""Scripted judge providers that enforce each provider's documented request rules, run as their own process:
`python -m tests.llm.fake_judges PORT`. They stand in for paid APIs no test here can reach.

- /openai/v1/chat/completions, OpenAI: a `strict` JSON schema must close every object
  (`additionalProperties: false`), list every property as required and use only the keywords strict mode
  compiles; its reasoning models (o-series, gpt-5) refuse `max_tokens`, a temperature other than 1 and
  `logprobs`, and spend 300 reasoning tokens from `max_completion_tokens` before the answer (too few: an empty
  answer cut off by `length`). Other models return log-probabilities when asked.
- /anthropic/v1/messages, Anthropic Messages: `max_tokens` required; a field the API does not define (`logprobs`,
  `top_logprobs`, `response_format`, ...) is a 400; no log-probabilities exist. Structured outputs: `output_config`
  with a JSON-schema `format`, or the beta's `output_format` with its `anthropic-beta: structured-outputs-2025-11-13`
  header, each with every object closed (`additionalProperties: false`), answered as JSON text; a forced tool is
  answered with a `tool_use` block whose input fits the tool's schema.
- /gemini/models/{model}:generateContent, the Gemini API: the key in `x-goog-api-key` (or `?key=`); a field of
  `generationConfig` the API does not define is a 400; a JSON schema in `responseJsonSchema` (or the OpenAPI-style
  `responseSchema`); the 2.5 models think by default, spending up to 300 tokens of `maxOutputTokens` (or the
  thinking budget, if lower) before the answer: too few, and the candidate has no text, cut off by MAX_TOKENS.
- /vllm/v1/chat/completions, an OpenAI-compatible server (vLLM, llama.cpp): log-probabilities when asked, a
  JSON schema followed loosely.
- A key starting `sk-revoked` is refused on the OpenAI route with a 401 that repeats the key whole, as providers'
  "Incorrect API key provided: ..." errors do (OpenAI shows its start and end).

Prompt caches, as each provider reports them: OpenAI and Gemini serve by themselves a prompt that opens with at
least `CACHED_PREFIX` characters an earlier prompt opened with (reported as `prompt_tokens_details.cached_tokens`,
`cachedContentTokenCount`: `CACHED_TOKENS` of the 50 input tokens); Anthropic serves only a prefix ending in a block
marked `cache_control: {"type": "ephemeral"}` (a field the block may carry, nothing else), written the first time
(`cache_creation_input_tokens`) and read after (`cache_read_input_tokens`).

Every judge finds fault (NO, or a label such as "contradicted"), as a JSON object fitting the schema asked
for, or as the word. What arrives is listed at GET /_seen. What such fakes cannot show: the providers' real
model quality, latency and rate limits, and rules their documentation does not state.
"""

from __future__ import annotations

import json
import os
import sys
import time

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

REASONING_TOKENS = 300
STRICT_KEYWORDS = {"type", "properties", "required", "additionalProperties", "items", "enum", "const", "anyOf",
                   "description", "$defs", "$ref"}
OPENAI_CHAT_FIELDS = {"model", "messages", "temperature", "top_p", "n", "stop", "max_tokens",
                      "max_completion_tokens", "presence_penalty", "frequency_penalty", "logit_bias", "logprobs",
                      "top_logprobs", "user", "seed", "tools", "tool_choice", "response_format", "stream",
                      "stream_options", "reasoning_effort", "parallel_tool_calls", "metadata", "store"}
ANTHROPIC_FIELDS = {"model", "messages", "max_tokens", "system", "temperature", "top_p", "top_k", "stop_sequences",
                    "stream", "tools", "tool_choice", "metadata", "thinking", "service_tier", "container",
                    "mcp_servers", "output_config"}
STRUCTURED_BETA = "structured-outputs-2025-11-13"
seen: list[dict] = []
CACHED_PREFIX = 200
CACHED_TOKENS = 40
prompts: dict[str, list[str]] = {}  # each model's prompts so far, as one text: what its cache could hold


def cached_by_prefix(model: str, text: str) -> int:
    """The input tokens an automatic prefix cache serves: CACHED_TOKENS where an earlier prompt to the same model
    opened alike."""
    earlier = prompts.setdefault(model, [])
    hit = any(len(os.path.commonprefix([text, other])) >= CACHED_PREFIX for other in earlier)
    earlier.append(text)
    return CACHED_TOKENS if hit else 0


def anthropic_cache(body: dict) -> tuple[int, int] | str:
    """(tokens written to the cache, tokens read from it) for the prefix up to the marked block, or what is wrong
    with a mark."""
    opened = json.dumps([body.get("model"), body.get("system")])  # a cache per model
    for message in body.get("messages") or []:
        content = message.get("content")
        for block in content if isinstance(content, list) else []:
            opened += json.dumps(block.get("text"))
            mark = block.get("cache_control")
            if mark is None:
                continue
            if mark != {"type": "ephemeral"} and mark.get("type") != "ephemeral":
                return "cache_control.type: Input should be 'ephemeral'"
            earlier = prompts.setdefault("anthropic", [])
            if opened in earlier:
                return 0, CACHED_TOKENS
            earlier.append(opened)
            return CACHED_TOKENS, 0
    return 0, 0


def error(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": None}}, status_code=status)


def strict_problem(schema: object, where: str = "root") -> str | None:
    """What OpenAI's strict mode refuses in `schema`, or None."""
    if not isinstance(schema, dict):
        return None
    unknown = set(schema) - STRICT_KEYWORDS
    if unknown:
        return f"In context=({where}), '{sorted(unknown)[0]}' is not permitted."
    if schema.get("type") == "object" or "properties" in schema:
        properties = schema.get("properties") or {}
        if schema.get("additionalProperties") is not False:
            return f"In context=({where}), 'additionalProperties' is required to be supplied and to be false."
        missing = set(properties) - set(schema.get("required") or [])
        if missing:
            return (f"In context=({where}), 'required' is required to be supplied and to be an array including "
                    f"every key in properties. Missing '{sorted(missing)[0]}'.")
        for name, value in properties.items():
            problem = strict_problem(value, f"{where}, '{name}'")
            if problem:
                return problem
    for key in ("items",):
        problem = strict_problem(schema.get(key), f"{where}, '{key}'")
        if problem:
            return problem
    for option in schema.get("anyOf") or []:
        problem = strict_problem(option, f"{where}, anyOf")
        if problem:
            return problem
    return None


def instance(schema: object) -> object:
    """A value that fits `schema`: NO for a verdict, one item for a list."""
    if not isinstance(schema, dict):
        return "NO"
    if "anyOf" in schema:
        return instance(schema["anyOf"][0])
    if "enum" in schema:  # the verdict or label that finds fault
        return next((v for v in ("NO", "contradicted", "contradiction", "unsupported") if v in schema["enum"]),
                    schema["enum"][-1])
    kind = schema.get("type")
    if kind == "object":
        return {name: instance(value) for name, value in (schema.get("properties") or {}).items()}
    if kind == "array":
        return [instance(schema.get("items")) for _ in range(max(1, int(schema.get("minItems", 1))))]
    if kind in ("integer", "number"):
        return 1
    if kind == "boolean":
        return False
    return "The context does not state this."


def reply_text(body: dict) -> str:
    format_ = body.get("response_format") or {}
    if format_.get("type") == "json_schema":
        return json.dumps(instance(format_["json_schema"]["schema"]))
    if format_.get("type") == "json_object":
        return json.dumps({"verdict": "NO"})
    return "NO"


def logprobs_of(text: str, top: int) -> dict:
    """Tokens of the reply, each weighing NO against YES where a verdict is written."""
    tokens = [text[i:i + 3] for i in range(0, len(text), 3)] if text != "NO" else ["NO"]
    content = []
    for token in tokens:
        alternatives = [{"token": token, "logprob": -0.05, "bytes": None}]
        if token.strip('"') in ("NO", "NO\""):
            alternatives.append({"token": "YES", "logprob": -3.0, "bytes": None})
        content.append({"token": token, "logprob": -0.05, "bytes": None, "top_logprobs": alternatives[:top]})
    return {"content": content}


def completion(model: str, text: str, finish: str, body: dict, reasoning: int = 0, cached: int = 0) -> JSONResponse:
    usage = {"prompt_tokens": 50, "completion_tokens": len(text) // 3 + 1 + reasoning,
             "total_tokens": 51 + len(text) // 3 + reasoning,
             "prompt_tokens_details": {"cached_tokens": cached},
             "completion_tokens_details": {"reasoning_tokens": reasoning}}
    choice = {"index": 0, "message": {"role": "assistant", "content": text, "refusal": None}, "finish_reason": finish,
              "logprobs": logprobs_of(text, int(body.get("top_logprobs") or 0)) if body.get("logprobs") else None}
    return JSONResponse({"id": "chatcmpl-judge", "object": "chat.completion", "created": int(time.time()),
                         "model": model, "choices": [choice], "usage": usage})


def is_reasoning(model: str) -> bool:
    return model.startswith(("o1", "o3", "o4", "gpt-5"))


async def openai_chat(request: Request) -> Response:
    body = await request.json()
    seen.append({"provider": "openai", "body": body})
    key = request.headers.get("authorization", "").removeprefix("Bearer ")
    if key.startswith("sk-revoked"):
        return error(401, f"Incorrect API key provided: {key}. You can find your API key at "
                          "https://platform.openai.com/account/api-keys.", "invalid_request_error")
    unknown = set(body) - OPENAI_CHAT_FIELDS
    if unknown:
        return error(400, f"Unrecognized request argument supplied: {sorted(unknown)[0]}")
    model = body.get("model", "")
    format_ = body.get("response_format") or {}
    if format_.get("type") == "json_schema" and format_.get("json_schema", {}).get("strict"):
        problem = strict_problem(format_["json_schema"].get("schema"))
        if problem:
            return error(400, f"Invalid schema for response_format 'answer': {problem}", param="response_format")
    cached = cached_by_prefix(model, "".join(str(m.get("content")) for m in body.get("messages") or []))
    if is_reasoning(model):
        if "max_tokens" in body:
            return error(400, "Unsupported parameter: 'max_tokens' is not supported with this model. Use "
                              "'max_completion_tokens' instead.", "invalid_request_error", "max_tokens")
        if body.get("temperature") not in (None, 1):
            return error(400, f"Unsupported value: 'temperature' does not support {body['temperature']} with this "
                              "model. Only the default (1) value is supported.", param="temperature")
        if body.get("logprobs") or body.get("top_logprobs"):
            return error(400, "This model does not support logprobs.", param="logprobs")
        text = reply_text(body)
        budget = body.get("max_completion_tokens") or 100_000
        if budget < REASONING_TOKENS + len(text) // 3 + 1:  # the budget went on thinking
            return completion(model, "", "length", body, reasoning=min(budget, REASONING_TOKENS))
        return completion(model, text, "stop", body, reasoning=REASONING_TOKENS, cached=cached)
    return completion(model, reply_text(body), "stop", body, cached=cached)


async def vllm_chat(request: Request) -> Response:
    body = await request.json()
    seen.append({"provider": "vllm", "body": body})
    return completion(body.get("model", ""), reply_text(body), "stop", body)


async def anthropic_messages(request: Request) -> Response:
    body = await request.json()
    betas = request.headers.get("anthropic-beta", "")
    seen.append({"provider": "anthropic", "body": body, "version": request.headers.get("anthropic-version"),
                 "beta": betas})
    if not request.headers.get("x-api-key"):
        return anthropic_error(401, "x-api-key header is required", "authentication_error")
    fields = ANTHROPIC_FIELDS | ({"output_format"} if STRUCTURED_BETA in betas else set())
    unknown = set(body) - fields
    if unknown:
        return anthropic_error(400, f"{sorted(unknown)[0]}: Extra inputs are not permitted")
    if not isinstance(body.get("max_tokens"), int):
        return anthropic_error(400, "max_tokens: Field required")
    cache = anthropic_cache(body)
    if isinstance(cache, str):
        return anthropic_error(400, cache)
    format_ = body.get("output_format") or (body.get("output_config") or {}).get("format")
    choice = body.get("tool_choice") or {}
    tools = {t.get("name"): t for t in body.get("tools") or []}
    if format_ is not None:
        problem = open_object(format_.get("schema"))
        if format_.get("type") != "json_schema" or problem:
            return anthropic_error(400, f"output_format.schema: {problem or 'a json_schema format is required'}")
        block: dict = {"type": "text", "text": json.dumps(instance(format_["schema"]))}
        stop = "end_turn"
    elif choice.get("type") == "tool" and choice.get("name") in tools:
        block = {"type": "tool_use", "id": "toolu_judge", "name": choice["name"],
                 "input": instance(tools[choice["name"]].get("input_schema"))}
        stop = "tool_use"
    else:
        block = {"type": "text", "text": "NO"}
        stop = "end_turn"
    return JSONResponse({"id": "msg_judge", "type": "message", "role": "assistant", "model": body["model"],
                         "content": [block], "stop_reason": stop, "stop_sequence": None,
                         "usage": {"input_tokens": 50, "output_tokens": 5, "cache_creation_input_tokens": cache[0],
                                   "cache_read_input_tokens": cache[1]}})


def anthropic_error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"type": "error", "error": {"type": kind, "message": message}}, status)


def open_object(schema: object) -> str | None:
    """An object of `schema` that is not closed (Anthropic's structured outputs need every one closed), or None."""
    if isinstance(schema, list):
        return next((p for p in map(open_object, schema) if p), None)
    if not isinstance(schema, dict):
        return None
    if (schema.get("type") == "object" or "properties" in schema) and schema.get("additionalProperties") is not False:
        return "For 'object' type, 'additionalProperties' must be explicitly set to false"
    return next((p for p in map(open_object, schema.values()) if p), None)


GEMINI_CONFIG = {"temperature", "topP", "topK", "candidateCount", "maxOutputTokens", "stopSequences",
                 "responseMimeType", "responseSchema", "responseJsonSchema", "responseLogprobs", "logprobs",
                 "thinkingConfig", "seed", "presencePenalty", "frequencyPenalty", "responseModalities"}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(word.title() for word in rest)


async def gemini_generate(request: Request) -> Response:
    """The API takes its fields in either case (proto JSON): read them as camelCase."""
    body = await request.json()
    model = request.path_params["model"]
    seen.append({"provider": "gemini", "model": model, "body": body})
    if not (request.headers.get("x-goog-api-key") or request.query_params.get("key")):
        return error(403, "Method doesn't allow unregistered callers. Please use an API key.", "PERMISSION_DENIED")
    config = {_camel(k): v for k, v in (body.get("generationConfig") or body.get("generation_config") or {}).items()}
    unknown = set(config) - GEMINI_CONFIG
    if unknown:
        return error(400, f'Invalid JSON payload received. Unknown name "{sorted(unknown)[0]}" at '
                          "'generation_config': Cannot find field.", "INVALID_ARGUMENT")
    if "logprobs" in config and not config.get("responseLogprobs"):
        return error(400, "logprobs requires responseLogprobs to be set.", "INVALID_ARGUMENT")
    schema = config.get("responseJsonSchema") or config.get("responseSchema")
    text = json.dumps(instance(schema)) if schema else "NO"
    budget = (config.get("thinkingConfig") or {}).get("thinkingBudget", REASONING_TOKENS)
    thoughts = min(REASONING_TOKENS, budget if budget >= 0 else REASONING_TOKENS) if model.startswith("gemini-2.5") \
        else 0
    limit = config.get("maxOutputTokens") or 65_536
    parts: list[dict] = [{"text": text}]
    finish = "STOP"
    if limit < thoughts + len(text) // 3 + 1:
        parts, finish = [], "MAX_TOKENS"
    cached = cached_by_prefix(model, json.dumps([body.get("systemInstruction") or body.get("system_instruction"),
                                                    body.get("contents")]))
    return JSONResponse({"candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": finish,
                                         "index": 0}],
                         "usageMetadata": {"promptTokenCount": 50, "candidatesTokenCount": len(text) // 3 + 1,
                                           **({"cachedContentTokenCount": cached} if cached else {}),
                                           "thoughtsTokenCount": thoughts,
                                           "totalTokenCount": 51 + thoughts + len(text) // 3},
                         "modelVersion": model})


async def listing(request: Request) -> Response:
    return JSONResponse(seen)


app = Starlette(routes=[
    Route("/openai/v1/chat/completions", openai_chat, methods=["POST"]),
    Route("/vllm/v1/chat/completions", vllm_chat, methods=["POST"]),
    Route("/anthropic/v1/messages", anthropic_messages, methods=["POST"]),
    Route("/gemini/models/{model}:generateContent", gemini_generate, methods=["POST"]),
    Route("/_seen", listing),
])

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
