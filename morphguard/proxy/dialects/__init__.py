"""The APIs the proxy checks, one module each: chat completions (`chat`), OpenAI's Responses (`responses`) and
Anthropic's Messages (`messages`). Each is a `base.Dialect`; `proxy.flow` runs every one of them through the
same request path. A new API is one new module here and one route in `proxy.app`."""
