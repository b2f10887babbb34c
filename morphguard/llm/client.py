"""One async client for every judge call: litellm underneath, retries, timeouts, a concurrency limit,
token accounting and an optional cache for deterministic (temperature 0) calls.

Calls made side by side go through `together`, which cancels the rest of them when one fails. A check's judge calls
are bounded by the `CallBudget` its caller opens around it (`call_budget`; the checks of one stream share one):
every call the check's code makes, in whichever task, draws on it, and a call past it raises `JudgeCallCapError`
unsent. A check that knows its calls before it makes them (`sentences`) takes those that fit at once
(`reserve_up_to`) and reads only what they cover, rather than sending the first `limit` and failing.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar

from opentelemetry import trace
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    wait_random_exponential,
)

from morphguard import telemetry
from morphguard.errors import JudgeCallCapError, LLMError, LLMTimeoutError
from morphguard.fairness import FairLimit
from morphguard.llm.providers import Abilities, abilities, cache_marked, fitted, strict_schema

# litellm fetches a remote model-cost map at import unless told to use its bundled copy.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

log = logging.getLogger(__name__)

Message = dict[str, str]


@dataclass(frozen=True)
class TokenChoice:
    """One generated token and the alternatives the model weighed for that position."""

    token: str
    logprob: float
    alternatives: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Completion:
    text: str
    model: str
    input_tokens: int
    output_tokens: int
    seconds: float
    logprobs: tuple[TokenChoice, ...] | None = None
    cached: bool = False
    cached_input_tokens: int = 0  # of `input_tokens`, those the provider's prompt cache served


@dataclass(frozen=True)
class Endpoint:
    """Where a model name is served: the litellm model id plus an optional base URL and key."""

    model: str
    api_base: str | None = None
    api_key: str | None = None
    provider: str | None = None  # gen_ai.provider.name; None: the litellm prefix ("openai/..." → openai)
    # JSON schemas sent in the strict subset APIs compile (llm.providers); False where the server compiles the
    # whole schema, bounds included (llama.cpp turns it into a grammar)
    strict_schemas: bool = True

    @property
    def provider_name(self) -> str:
        return self.provider or (self.model.split("/", 1)[0] if "/" in self.model else "openai")


@dataclass
class Usage:
    calls: int = 0
    cached_calls: int = 0
    input_tokens: int = 0
    cached_input_tokens: int = 0
    output_tokens: int = 0
    seconds: float = 0.0

    def add(self, c: Completion) -> None:
        if c.cached:
            self.cached_calls += 1
            return
        self.calls += 1
        self.input_tokens += c.input_tokens
        self.cached_input_tokens += c.cached_input_tokens
        self.output_tokens += c.output_tokens
        self.seconds += c.seconds


class CallBudget:
    """How many judge calls one check may still make: `limit` in all, those `reserve`d counted at once."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0  # calls made or reserved
        self._reserved = 0  # reserved and not made yet

    def reserve(self, calls: int) -> None:
        """Take `calls` at once; JudgeCallCapError, taking none, where they would pass the limit."""
        if self.used + calls > self.limit:
            raise JudgeCallCapError(f"the check needs {self.used + calls} judge calls, more than "
                                    f"detector.max_judge_calls ({self.limit})")
        self.used += calls
        self._reserved += calls

    def reserve_up_to(self, calls: int) -> int:
        """Take as many of `calls` as the limit leaves, at once; how many were taken."""
        taken = max(0, min(calls, self.limit - self.used))
        self.reserve(taken)
        return taken

    def spend(self) -> None:
        """One call about to be sent: one reserved, else one more taken."""
        if not self._reserved:
            self.reserve(1)
        self._reserved -= 1


_BUDGET: ContextVar[CallBudget | None] = ContextVar("morphguard_judge_call_budget", default=None)


@contextmanager
def call_budget(limit: int | None, shared: CallBudget | None = None) -> Iterator[CallBudget | None]:
    """The judge calls of the code run inside (and of the tasks and threads it starts) bounded by `limit`; None:
    unbounded. `shared`: the budget of several checks (a stream's), drawn on instead of a new one."""
    budget = shared if shared is not None else CallBudget(limit) if limit is not None else None
    token = _BUDGET.set(budget)
    try:
        yield budget
    finally:
        _BUDGET.reset(token)


T = TypeVar("T")


async def together(calls: Iterable[Awaitable[T]]) -> list[T]:
    """Judge calls made side by side, their results in order. If one fails, the others are cancelled, and waited
    for, before its error is raised: no call of a failed check outlives it (`asyncio.gather` leaves them running)."""
    tasks = [asyncio.ensure_future(call) for call in calls]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def reserve(calls: int) -> None:
    """Take `calls` judge calls of the current check's budget at once, or none (JudgeCallCapError) where they would
    pass it (none open: nothing to take)."""
    budget = _BUDGET.get()
    if budget is not None:
        budget.reserve(calls)


def reserve_up_to(calls: int) -> int:
    """Take as many of `calls` judge calls as the current check's budget leaves, at once; how many (all of them where
    no budget is open)."""
    budget = _BUDGET.get()
    return calls if budget is None else budget.reserve_up_to(calls)


def calls_left() -> int | None:
    """The judge calls the current check's budget still leaves; None where no budget is open."""
    budget = _BUDGET.get()
    return None if budget is None else max(0, budget.limit - budget.used)


class TransientLLMError(LLMError):
    """A failure worth retrying (timeout, 429, 5xx, dropped connection)."""


async def retried(call: Callable[[], Awaitable[T]], attempts: int, name: str) -> T:
    """`call()` tried up to `attempts` times while it fails with a `TransientLLMError`, waiting a random exponential
    backoff between tries: the one retry rule of every judge call (the LLM judge's and a served verifier's).
    LLMTimeoutError or LLMError, naming `name`, once the tries are spent."""
    retrying = AsyncRetrying(
        retry=retry_if_exception(lambda e: isinstance(e, TransientLLMError)),
        wait=wait_random_exponential(multiplier=0.5, max=20),
        stop=stop_after_attempt(attempts),
        reraise=True,
    )
    try:
        async for attempt in retrying:
            with attempt:
                return await call()
    except TransientLLMError as exc:
        cause = exc.__cause__
        if isinstance(cause, TimeoutError) or "Timeout" in type(cause).__name__:
            raise LLMTimeoutError(f"{name}: timed out after {attempts} attempts") from exc
        raise LLMError(f"{name}: {exc} (after {attempts} attempts)") from exc
    raise AssertionError("unreachable")  # pragma: no cover


def spend() -> None:
    """One judge call about to be sent, drawn on the current check's budget (none open: nothing to draw)."""
    budget = _BUDGET.get()
    if budget is not None:
        budget.spend()


@dataclass
class LLMClient:
    """Calls any litellm-supported model; `routes` maps a name (e.g. "local") to where it is served."""

    default_model: str
    routes: dict[str, Endpoint] = field(default_factory=dict)
    api_base: str | None = None
    api_key: str | None = None
    timeout_s: float = 120.0
    max_attempts: int = 4
    concurrency: int = 8
    cache_entries: int = 0  # 0 disables the response cache
    logprobs: bool | None = None  # None: as litellm knows the model (llm.providers)
    reasoning: bool | None = None
    reasoning_tokens: int = 2048  # a reasoning model's room to think, on top of the answer's own tokens
    reasoning_effort: str | None = "low"
    votes: int = 1  # without log-probabilities: samples of a yes/no question, for a soft verdict
    usage: Usage = field(default_factory=Usage)

    def __post_init__(self) -> None:
        import litellm  # noqa: F401  (slow, ~4 s: paid once here rather than inside the first timed call)

        self._limits: dict[int, FairLimit] = {}  # one per event loop: sync callers run several
        self._cache: OrderedDict[str, Completion] = OrderedDict()

    def _limit(self) -> FairLimit:
        """The judge's places (`concurrency`), taken by the clients checks run for in turn (`fairness`)."""
        loop = id(asyncio.get_running_loop())
        if loop not in self._limits:
            self._limits = {loop: FairLimit(self.concurrency)}
        return self._limits[loop]

    def endpoint(self, model: str | None) -> Endpoint:
        name = model or self.default_model
        return self.routes.get(name) or Endpoint(name, self.api_base, self.api_key)

    def abilities(self, model: str | None = None) -> Abilities:
        """What the model behind `model` (None: the default judge) accepts."""
        return abilities(self.endpoint(model).model, self.logprobs, self.reasoning)

    async def probe(self, model: str | None = None) -> None:
        """Two calls shaped like the checks' own (a yes/no word with log-probabilities, a verdict in a JSON
        schema); LLMError, saying what failed, if the judge cannot answer them."""
        question = [{"role": "system", "content": "You check facts. Answer with one word: YES or NO."},
                    {"role": "user", "content": "Passage: Water boils at 100 degrees Celsius at sea level.\n"
                                                "Statement: Water boils at 100 degrees Celsius at sea level.\n"
                                                "Does the passage state this?"}]
        schema = {"type": "object", "properties": {"verdict": {"type": "string", "enum": ["YES", "NO"]}},
                  "required": ["verdict"]}
        name = self.endpoint(model).model
        for call in ({"max_tokens": 2, "top_logprobs": 5}, {"max_tokens": 16, "json_schema": schema}):
            reply = await self.complete(question, model=model, **call)
            if not reply.text.strip():
                raise LLMError(f"{name}: the judge answered with no text (a reasoning model out of tokens? "
                               "raise judge.reasoning_tokens)")

    async def complete(
        self,
        messages: list[Message],
        *,
        model: str | None = None,
        temperature: float = 0.0,
        max_tokens: int = 256,
        json_schema: dict[str, Any] | None = None,
        top_logprobs: int = 0,
        shared: int = 0,
    ) -> Completion:
        """One judge call. `shared`: how many characters the last message opens with that other calls of the check
        open with too (after the same messages before it): the prefix a provider's prompt cache can serve, marked
        where the provider caches only what is marked (`providers.cache_marked`)."""
        endpoint = self.endpoint(model)
        request: dict[str, Any] = {
            "model": endpoint.model,
            "messages": cache_marked(messages, endpoint.provider_name, shared),
            "temperature": temperature,
            "max_tokens": max_tokens,
        }
        if json_schema is not None:
            request["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "answer", "strict": True,
                                "schema": strict_schema(json_schema) if endpoint.strict_schemas else json_schema},
            }
        if top_logprobs:
            request["logprobs"] = True
            request["top_logprobs"] = top_logprobs
        request = fitted(request, self.abilities(model), reasoning_tokens=self.reasoning_tokens,
                         reasoning_effort=self.reasoning_effort)
        key = self._cache_key(request, endpoint) if temperature == 0 and self.cache_entries else None
        if key is not None and key in self._cache:
            self._cache.move_to_end(key)
            hit = self._cache[key]
            result = Completion(hit.text, hit.model, hit.input_tokens, hit.output_tokens, 0.0, hit.logprobs, True)
            self.usage.add(result)
            return result

        spend()
        result = await self._call_with_retries(request, endpoint)
        self.usage.add(result)
        if key is not None:
            self._cache[key] = result
            if len(self._cache) > self.cache_entries:
                self._cache.popitem(last=False)
        return result

    async def _call_with_retries(self, request: dict[str, Any], endpoint: Endpoint) -> Completion:
        return await retried(lambda: self._call_once(request, endpoint), self.max_attempts, endpoint.model)

    async def _call_once(self, request: dict[str, Any], endpoint: Endpoint) -> Completion:
        """One call inside its GenAI client span (a child of the current stage's span)."""
        async with self._limit().slot():
            span = telemetry.start_chat_span(request["model"], endpoint.provider_name, "judge", request["messages"])
            started = time.perf_counter()
            try:
                with trace.use_span(span, end_on_exit=True):
                    completion = await self._request(request, endpoint)
                    telemetry.record_chat(
                        span, provider=endpoint.provider_name, role="judge", request_model=request["model"],
                        response_model=completion.model, input_tokens=completion.input_tokens,
                        output_tokens=completion.output_tokens, seconds=completion.seconds,
                        output_text=completion.text)
                    return completion
            except Exception as exc:
                telemetry.record_chat(span, provider=endpoint.provider_name, role="judge",
                                      request_model=request["model"], response_model=None, input_tokens=None,
                                      output_tokens=None, seconds=time.perf_counter() - started,
                                      error_type=type(exc).__qualname__)
                raise

    async def _request(self, request: dict[str, Any], endpoint: Endpoint) -> Completion:
        import litellm

        started = time.perf_counter()
        try:
            response = await asyncio.wait_for(
                litellm.acompletion(
                    **request,
                    api_base=endpoint.api_base,
                    api_key=endpoint.api_key,
                    timeout=self.timeout_s,
                    num_retries=0,
                ),
                timeout=self.timeout_s,
            )
        except Exception as exc:  # classify provider errors as retryable or final
            if _is_transient(exc):
                log.warning("transient LLM failure from %s: %s", endpoint.model, type(exc).__name__)
                raise TransientLLMError(_safe_message(exc)) from exc
            raise LLMError(f"{endpoint.model}: {_safe_message(exc)}") from exc
        seconds = time.perf_counter() - started
        choice = response.choices[0]
        text = choice.message.content or ""
        usage = getattr(response, "usage", None)
        input_tokens = getattr(usage, "prompt_tokens", None) or _count_tokens(endpoint.model, request["messages"])
        output_tokens = getattr(usage, "completion_tokens", None) or _count_tokens(endpoint.model, text)
        return Completion(
            text=text,
            model=endpoint.model,
            input_tokens=int(input_tokens),
            output_tokens=int(output_tokens),
            seconds=seconds,
            logprobs=_read_logprobs(getattr(choice, "logprobs", None)),
            cached_input_tokens=_cached_tokens(usage),
        )

    @staticmethod
    def _cache_key(request: dict[str, Any], endpoint: Endpoint) -> str:
        blob = json.dumps([request, endpoint.api_base], sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError, ConnectionError)):
        return True
    name = type(exc).__name__
    if name in {"Timeout", "APITimeoutError", "APIConnectionError", "RateLimitError", "InternalServerError",
                "ServiceUnavailableError", "BadGatewayError"}:
        return True
    status = getattr(exc, "status_code", None)
    return isinstance(status, int) and (status == 429 or status == 408 or status >= 500)


def _safe_message(exc: BaseException) -> str:
    """The provider's message, cut short; litellm messages never carry the API key, but keep them brief."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"{type(exc).__name__}: {text[:300]}"


def _count_tokens(model: str, content: Any) -> int:
    """Fallback when the provider reports no usage: litellm's tokenizer, else ~4 characters a token."""
    try:
        import litellm

        if isinstance(content, str):
            return int(litellm.token_counter(model=model, text=content))
        return int(litellm.token_counter(model=model, messages=content))
    except Exception:
        size = len(content) if isinstance(content, str) else sum(len(m.get("content", "")) for m in content)
        return max(1, size // 4)


def _cached_tokens(usage: Any) -> int:
    """The input tokens a provider's prompt cache served, as litellm reports them: OpenAI's
    `prompt_tokens_details.cached_tokens`, into which it maps Anthropic's `cache_read_input_tokens` and Gemini's
    `cachedContentTokenCount`; else Anthropic's own field."""
    details = getattr(usage, "prompt_tokens_details", None)
    found = details.get("cached_tokens") if isinstance(details, dict) else getattr(details, "cached_tokens", None)
    if not found:
        found = getattr(usage, "cache_read_input_tokens", None)
    return found if isinstance(found, int) and found > 0 else 0


def _read_logprobs(raw: Any) -> tuple[TokenChoice, ...] | None:
    content = getattr(raw, "content", None) if raw is not None else None
    if content is None and isinstance(raw, dict):
        content = raw.get("content")
    if not content:
        return None
    choices = []
    for item in content:
        get = item.get if isinstance(item, dict) else lambda k, i=item: getattr(i, k, None)
        alternatives = tuple(
            (alt["token"], float(alt["logprob"])) if isinstance(alt, dict) else (alt.token, float(alt.logprob))
            for alt in (get("top_logprobs") or [])
        )
        choices.append(TokenChoice(get("token") or "", float(get("logprob") or 0.0), alternatives))
    return tuple(choices)
