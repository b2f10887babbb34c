"""How morphguard talks to LLMs: one async client (llm.client) and the embedded judge (llm.local)."""

from __future__ import annotations

from collections.abc import Iterable

from morphguard.config import Config
from morphguard.llm.client import Completion, Endpoint, LLMClient, TokenChoice, Usage
from morphguard.llm.local import LOCAL_MODEL, shared_judge

__all__ = ["Completion", "Endpoint", "LLMClient", "TokenChoice", "Usage", "build_client", "uses_embedded_judge"]


def uses_embedded_judge(config: Config, models: Iterable[str | None] = ()) -> bool:
    """Whether a client for `models` (None: the judge's model) needs the embedded judge."""
    return LOCAL_MODEL in {m or config.judge.model for m in (*models, config.judge.model)}


def build_client(config: Config, models: Iterable[str | None] = ()) -> LLMClient:
    """A client for the judge of `config`; the embedded judge is started if any of `models` is "local"."""
    judge = config.judge
    routes: dict[str, Endpoint] = {}
    concurrency = judge.concurrency
    if uses_embedded_judge(config, models):
        # llama.cpp decodes `parallel` requests at a time and queues the rest; queue here instead, so a call's
        # timeout measures its own decoding, not the wait behind a dozen others.
        concurrency = min(concurrency, config.local.parallel)
        base_url = shared_judge(config.local).start()
        # llama.cpp serves one model whatever name it is asked for; "openai/" makes litellm speak its API.
        routes[LOCAL_MODEL] = Endpoint("openai/" + config.local.filename, base_url, "no-key", provider="llama.cpp",
                                       strict_schemas=False)
    return LLMClient(
        default_model=judge.model,
        routes=routes,
        api_base=judge.api_base,
        api_key=judge.api_key.get_secret_value() if judge.api_key else None,
        timeout_s=judge.timeout_s,
        max_attempts=judge.max_attempts,
        concurrency=concurrency,
        cache_entries=judge.cache.max_entries if judge.cache.enabled else 0,
        logprobs=judge.logprobs,
        reasoning=judge.reasoning,
        reasoning_tokens=judge.reasoning_tokens,
        reasoning_effort=judge.reasoning_effort,
        votes=judge.votes,
    )
