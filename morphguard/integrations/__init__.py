"""morphguard inside or beside other frameworks, one module or folder each: `litellm` (a guardrail in LiteLLM's
proxy), `portkey` (Portkey's webhook guardrail, served by the proxy's check API), `nemo_rail` (a NeMo Guardrails
output rail that calls `/v1/check`), `guardrails_ai` (a Guardrails AI validator that calls it too) and `clients`
(helpers for apps behind the proxy that read its verdict where a client library drops it)."""
