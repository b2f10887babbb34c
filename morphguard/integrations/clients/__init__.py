"""Helpers for apps behind the proxy: the verdict of each answer, where a client drops it on its way.

`verdict_of` reads it from what a client returns; `VerdictCapture` (an httpx event hook) takes it off the
wire for clients that drop it; `agents_sdk.verdict_guardrail` puts it on the Agents SDK's `RunResult`. They use
only the clients' public hooks, and import nothing of the proxy."""

from morphguard.integrations.clients.capture import VerdictCapture, verdict_of

__all__ = ["VerdictCapture", "verdict_of"]
