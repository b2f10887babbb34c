"""What a judge's provider accepts, and the request that fits it.

Providers differ in what a judge call may ask for:
- OpenAI compiles a strict JSON schema only from a subset of JSON Schema, in which every object lists all of its
  properties as required and forbids others (`additionalProperties: false`); an optional property is written as
  "this or null".
- OpenAI's reasoning models (o-series, gpt-5) take no temperature but 1, count `max_completion_tokens` rather
  than `max_tokens`, and spend hidden reasoning tokens from that budget before the first visible one: two tokens
  leave them nothing to answer with. Gemini's thinking models spend their thinking from the same budget.
- Anthropic's models, OpenAI's reasoning models and some servers (Ollama) return no log-probabilities, and Gemini
  returns the chosen token's alone, without the alternatives a verdict's weight is read from.
- OpenAI and Gemini cache the longest prompt prefix they have seen lately by themselves; Anthropic caches only up to
  a block marked `cache_control` (`cache_marked`). Each reports the input its cache served in its own words, which
  litellm maps to `usage.prompt_tokens_details.cached_tokens`.

litellm knows the parameters of the models it has seen (`get_supported_openai_params`, `supports_reasoning`);
`judge.logprobs` and `judge.reasoning` say it for a model it does not know (a fine-tune, a self-hosted name).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

# The keywords every strict-schema provider compiles. Length bounds (`maxLength`, `minItems`, ...) are left out:
# OpenAI has refused them in strict schemas, and the prompts state the lengths they want anyway.
_STRICT_KEYWORDS = frozenset({"type", "properties", "required", "additionalProperties", "items", "enum", "const",
                              "anyOf", "description", "$defs", "$ref"})
# Providers whose reasoning models think by default, from the answer's own token budget.
_THINKS_BY_DEFAULT = frozenset({"openai", "azure", "gemini", "vertex_ai", "vertex_ai_beta"})


@dataclass(frozen=True)
class Abilities:
    """What one judge model accepts."""

    provider: str
    logprobs: bool  # returns log-probabilities of its tokens
    reasoning: bool  # thinks before answering, from the same token budget, at a fixed temperature


@lru_cache(maxsize=64)
def abilities(model: str, logprobs: bool | None = None, reasoning: bool | None = None) -> Abilities:
    """The abilities of a litellm model id ("openai/gpt-4.1-mini", "anthropic/claude-...", "hosted_vllm/...");
    `logprobs` and `reasoning`, when given, override what litellm knows."""
    import litellm

    try:
        name, provider, _, _ = litellm.get_llm_provider(model)
    except Exception:  # a name litellm cannot place: spoken to as OpenAI's API
        name, provider = model.split("/", 1)[-1], "openai"
    if logprobs is None:
        try:
            supported = litellm.get_supported_openai_params(model=name, custom_llm_provider=provider) or []
        except Exception:
            supported = []
        logprobs = {"logprobs", "top_logprobs"} <= set(supported)  # a verdict's weight needs the alternatives
    if reasoning is None:
        try:
            reasoning = bool(litellm.supports_reasoning(model=f"{provider}/{name}")) and provider in _THINKS_BY_DEFAULT
        except Exception:
            reasoning = False
    return Abilities(provider=provider, logprobs=logprobs, reasoning=reasoning)


def strict_schema(schema: Any) -> Any:
    """`schema` in the strict subset: every object closed, every property required (an optional one may be
    null), keywords outside the subset dropped."""
    if isinstance(schema, list):
        return [strict_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: value for key, value in schema.items() if key in _STRICT_KEYWORDS}
    if "items" in out:
        out["items"] = strict_schema(out["items"])
    if "anyOf" in out:
        out["anyOf"] = strict_schema(out["anyOf"])
    if isinstance(out.get("$defs"), dict):
        out["$defs"] = {name: strict_schema(value) for name, value in out["$defs"].items()}
    if out.get("type") == "object" or "properties" in out:
        properties = {name: strict_schema(value) for name, value in (out.get("properties") or {}).items()}
        required = set(out.get("required") or [])
        out["properties"] = {name: value if name in required else {"anyOf": [value, {"type": "null"}]}
                             for name, value in properties.items()}
        out["required"] = list(properties)
        out["additionalProperties"] = False
    return out


# Providers that cache a prompt only up to a block marked `cache_control` (litellm's prefixes).
_MARKS_CACHE = frozenset({"anthropic"})


def cache_marked(messages: list[dict[str, Any]], provider: str, shared: int) -> list[dict[str, Any]]:
    """`messages`, where the provider caches only a marked prefix, with the first `shared` characters of the last
    message (those every call of a check opens with, after the messages before it) a text block of their own
    marked `cache_control: ephemeral`, the rest a second block, as Anthropic's prompt caching documents."""
    if provider not in _MARKS_CACHE or shared <= 0 or not messages:
        return messages
    last = messages[-1]
    content = last.get("content")
    if not isinstance(content, str) or not 0 < shared < len(content):
        return messages
    blocks = [{"type": "text", "text": content[:shared], "cache_control": {"type": "ephemeral"}},
              {"type": "text", "text": content[shared:]}]
    return [*messages[:-1], {**last, "content": blocks}]


def fitted(request: dict[str, Any], found: Abilities, *, reasoning_tokens: int,
           reasoning_effort: str | None) -> dict[str, Any]:
    """The judge request (OpenAI's parameters, as litellm takes them) made acceptable to the provider."""
    out = dict(request)
    if not found.logprobs:
        out.pop("logprobs", None)
        out.pop("top_logprobs", None)
    if found.reasoning:
        out.pop("temperature", None)
        out["max_completion_tokens"] = out.pop("max_tokens", 0) + reasoning_tokens
        if reasoning_effort:
            out["reasoning_effort"] = reasoning_effort
    return out
