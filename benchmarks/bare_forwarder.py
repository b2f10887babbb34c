"""The least a Python proxy on morphguard's stack can add: uvicorn (httptools, uvloop) serving one plain ASGI
callable that reads the request body, posts it to the upstream through a pooled aiohttp session and returns the
answer's bytes. No routing, no validation, no audit, no telemetry: what the server and the client libraries cost
on their own, the floor under any proxy built on them (benchmarks/proxy_overhead.py measures it beside morphguard).

    python benchmarks/bare_forwarder.py PORT UPSTREAM_BASE_URL
"""

from __future__ import annotations

import sys
from typing import Any

import aiohttp
import uvicorn


def app(upstream: str) -> Any:
    session: aiohttp.ClientSession | None = None

    async def forward(scope: dict[str, Any], receive: Any, send: Any) -> None:
        nonlocal session
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                if message["type"] == "lifespan.startup":
                    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
                    await send({"type": "lifespan.startup.complete"})
            assert session is not None
            await session.close()
            await send({"type": "lifespan.shutdown.complete"})
            return
        assert session is not None
        if scope["path"] == "/healthz":
            body, status = b"{}", 200
        else:
            request = b""
            while True:
                message = await receive()
                request += message.get("body", b"")
                if not message.get("more_body"):
                    break
            headers = {"content-type": "application/json"}
            for name, value in scope["headers"]:
                if name == b"authorization":
                    headers["authorization"] = value.decode("latin-1")
            async with session.post(upstream + scope["path"].removeprefix("/v1"), data=request,
                                    headers=headers) as answer:
                body, status = await answer.read(), answer.status
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    return forward


if __name__ == "__main__":
    uvicorn.run(app(sys.argv[2]), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False,
                http="httptools", loop="uvloop", lifespan="on")
