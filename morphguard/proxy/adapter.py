"""Chat completions for non-OpenAI providers through litellm, chosen by model-name prefix.

litellm translates the request to the provider's API and the answer back to OpenAI's shape, so the
rest of the proxy (context, check, verdict, streaming) does not know the difference.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from morphguard.config import LitellmRoute
from morphguard.masking import mask_secrets
from morphguard.proxy.errors import ProxyError, bad_request, upstream_timeout, upstream_unavailable

# The chat parameters a client may send through a litellm route. litellm also takes where to connect and with
# which credentials from the same arguments (api_base, base_url, api_key, fallbacks, extra_headers, ...): those
# come from the route alone, so any field not listed here is refused rather than passed on.
FORWARDED = frozenset({
    "model", "messages", "stream", "stream_options", "temperature", "top_p", "n", "stop", "max_tokens",
    "max_completion_tokens", "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "top_logprobs",
    "user", "seed", "tools", "tool_choice", "parallel_tool_calls", "functions", "function_call",
    "response_format", "reasoning_effort", "modalities", "audio", "prediction", "service_tier",
    "web_search_options",
})


class LitellmAdapter:
    def __init__(self, routes: list[LitellmRoute], timeout_s: float) -> None:
        self.routes = routes
        self.timeout_s = timeout_s

    def route_for(self, model: Any) -> LitellmRoute | None:
        if not isinstance(model, str):
            return None
        return next((r for r in self.routes if model.startswith(r.prefix)), None)

    def _arguments(self, route: LitellmRoute, body: dict[str, Any]) -> dict[str, Any]:
        refused = sorted(set(body) - FORWARDED)
        if refused:
            name = refused[0][:64]
            raise bad_request(f"'{name}' is not a chat parameter this proxy forwards to {route.prefix}* models.", name)
        return {**body, "api_base": route.api_base, "timeout": self.timeout_s, "num_retries": 2,
                "api_key": route.api_key.get_secret_value() if route.api_key else None}

    async def complete(self, route: LitellmRoute, body: dict[str, Any]) -> dict[str, Any]:
        import litellm

        arguments = self._arguments(route, {**body, "stream": False})
        try:
            response = await litellm.acompletion(**arguments)
        except Exception as exc:
            raise _as_proxy_error(exc) from None
        return json.loads(response.model_dump_json())

    def stream(self, route: LitellmRoute, body: dict[str, Any]) -> AsyncIterator[str]:
        """The chunks as JSON; a body it may not forward is refused here, before the stream starts."""
        return self._stream(self._arguments(route, {**body, "stream": True}))

    async def _stream(self, arguments: dict[str, Any]) -> AsyncIterator[str]:
        import litellm

        try:
            chunks = await litellm.acompletion(**arguments)
        except Exception as exc:
            raise _as_proxy_error(exc) from None
        try:
            async for chunk in chunks:
                yield chunk.model_dump_json()
        except Exception as exc:  # a provider failure mid-stream, as the proxy's own error
            raise _as_proxy_error(exc) from None


def _as_proxy_error(exc: Exception) -> ProxyError:
    status = getattr(exc, "status_code", None)
    if "Timeout" in type(exc).__name__:
        return upstream_timeout()
    if isinstance(status, int) and 400 <= status < 500:
        # masked before it is cut: a key cut inside its echo ("sk-upst*****") would no longer be recognised
        return ProxyError(status, (mask_secrets(str(exc)).splitlines() or [""])[0][:300], "invalid_request_error")
    return upstream_unavailable(type(exc).__name__)
