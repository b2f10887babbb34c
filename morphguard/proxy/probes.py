"""The probes every process of a fleet answers, a proxy replica and a `morphguard worker` alike: /healthz (the
process is alive), /readyz (it can do its work) and /metrics (the Prometheus text format, `telemetry.prometheus`).

Readiness is decided here, once: the judge (when embedded), the check queue and the audit store must be
reachable, the store writing (not ready while it cannot, ready again once a write succeeds), and an audit trail
with gaps (rows the database refused) is not ready. The escalation backlog is reported,
never a reason to be unready: a webhook that is down is not this process's fault. The proxy adds its upstream.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from morphguard import telemetry
from morphguard.proxy.errors import (
    JSON,
    ProxyError,
    handle_http_error,
    handle_proxy_error,
    handle_unexpected,
    not_found,
)
from morphguard.proxy.gate import Gate
from morphguard.settle.guard import Guard
from morphguard.telemetry import setup as telemetry_setup


async def healthz(request: Request) -> Response:
    return JSON({"status": "ok"})


async def metrics(request: Request) -> Response:
    """The instruments in the Prometheus text format; 404 when `telemetry.prometheus` is off. The token
    (`telemetry.metrics_token`) is checked by the gate, before any route runs."""
    if not telemetry_setup.prometheus_enabled:
        raise not_found("/metrics")
    body, content_type = telemetry_setup.prometheus_text()
    return Response(body, media_type=content_type)


async def readiness(guard: Guard, **checked: bool) -> tuple[bool, dict[str, Any]]:
    """Whether the process is ready, and the body /readyz answers with; `checked`: what the caller checked
    itself (the proxy: its upstream), reported first."""
    checks: dict[str, Any] = dict(checked)
    judge = guard.judge_base
    if judge is not None:
        checks["judge"] = await _reachable(judge.removesuffix("/v1") + "/health")
    checks["queue"] = await guard.queue_reachable()
    if guard.audit is not None:
        # reachable, and writing: a full or read-only disk still answers a read
        checks["store"] = guard.store_writes and await asyncio.to_thread(guard.audit.reachable)
    ready = all(checks.values())
    if guard.audit_failures:
        checks["audit_failures"] = guard.audit_failures
        ready = False
    body: dict[str, Any] = {"status": "ready" if ready else "not_ready", "checks": checks}
    if checks.get("store"):
        body["escalation_backlog"] = await asyncio.to_thread(guard.escalation_backlog)
    return ready, body


async def readyz(guard: Guard, **checked: bool) -> Response:
    """/readyz: 200 when ready, else 503; the body says what was checked either way."""
    ready, body = await readiness(guard, **checked)
    return JSON(body, status_code=200 if ready else 503)


async def _reachable(url: str) -> bool:
    try:
        with telemetry.untraced():  # a probe, not a call anyone looks for in a trace
            async with httpx.AsyncClient(timeout=3.0) as client:
                return (await client.get(url)).status_code < 500
    except httpx.HTTPError:
        return False


def probe_app(guard: Guard) -> Gate:
    """The worker's HTTP side: the three probes and nothing else, behind the proxy's gate (canonical paths,
    the /metrics token) and with its OpenAI-shaped errors."""
    async def ready(request: Request) -> Response:
        return await readyz(guard)

    return Gate(Starlette(
        routes=[Route("/healthz", healthz, methods=["GET"]), Route("/readyz", ready, methods=["GET"]),
                Route("/metrics", metrics, methods=["GET"])],
        exception_handlers={ProxyError: handle_proxy_error, HTTPException: handle_http_error,
                            Exception: handle_unexpected}))
