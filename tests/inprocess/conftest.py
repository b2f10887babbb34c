"""The in-process tier: the proxy's app, built by its app factory (`proxy.app.create_app`), asked through
`httpx.ASGITransport` (the official SDKs take that client too), its lifespan run in the test's event loop; the
scripted provider (`tests/e2e/fake_provider.py`: the model upstream and the judge) served by uvicorn in the same loop
on a loopback socket; the audit trail and the check queue on SQLite in the test's folder. No process is started and
no Redis is needed: a file's tests share one event loop (anyio's pytest plugin), one provider and the apps they ask
for."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
import uvicorn

from morphguard.config import Config
from morphguard.proxy.app import create_app
from tests.e2e import fake_provider
from tests.servers import bound_socket

BASE = "http://morphguard.test"  # a name only: every request goes to the app in process
ASGIApp = Callable[[dict[str, Any], Callable[[], Awaitable[dict[str, Any]]],
                    Callable[[dict[str, Any]], Awaitable[None]]], Awaitable[None]]


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"  # the proxy's backend (aiohttp, its queue consumer) runs on asyncio


@pytest.fixture(scope="module")
async def provider(anyio_backend: str) -> AsyncIterator[str]:
    """The scripted provider's base URL (`.../v1`), served in this loop."""
    socket = bound_socket()
    # An idle connection is left to the client to close (aiohttp's pool: after 15 s): closed by the server meanwhile,
    # its end would wait behind the work of the loop the two share, and the proxy's next request on it would be reset.
    server = uvicorn.Server(uvicorn.Config(fake_provider.app, log_level="warning", lifespan="off",
                                           timeout_keep_alive=120))
    serving = asyncio.ensure_future(server.serve(sockets=[socket]))
    while not server.started:
        assert not serving.done(), "the scripted provider did not start"
        await asyncio.sleep(0.01)
    yield f"http://127.0.0.1:{socket.getsockname()[1]}/v1"
    server.should_exit = True
    await serving


@asynccontextmanager
async def lifespan(app: ASGIApp) -> AsyncIterator[None]:
    """The app's lifespan (start-up before the first request, shut-down after the last), as uvicorn runs it."""
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    running = asyncio.ensure_future(app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}},
                                        inbox.get, outbox.put))
    await inbox.put({"type": "lifespan.startup"})
    started = await outbox.get()
    assert started["type"] == "lifespan.startup.complete", started.get("message")
    try:
        yield
    finally:
        await inbox.put({"type": "lifespan.shutdown"})
        stopped = await outbox.get()
        await running
        assert stopped["type"] == "lifespan.shutdown.complete", stopped.get("message")


class InProcess:
    """One app, started: `client` asks it in process (`client2` too, for the SDKs built on `httpx2`); `folder` holds
    its audit trail and queue."""

    def __init__(self, client: httpx.AsyncClient, client2: httpx2.AsyncClient, folder: Path) -> None:
        self.client = client
        self.client2 = client2
        self.folder = folder

    def rows(self, where: str = "1", *args: object) -> list[dict[str, Any]]:
        """The audit trail's rows (`decisions`) that `where` selects, oldest first."""
        with sqlite3.connect(self.folder / "audit.db") as db:
            db.row_factory = sqlite3.Row
            return [dict(r) for r in db.execute(f"SELECT * FROM decisions WHERE {where} ORDER BY id", args)]

    def row(self, request_id: str) -> dict[str, Any]:
        found = self.rows("request_id = ?", request_id)
        assert len(found) == 1, f"{len(found)} audit rows for {request_id}"
        return found[0]

    async def row_in_time(self, request_id: str, seconds: float = 30) -> dict[str, Any]:
        """The row of a request checked after its answer went out, once its check wrote it."""
        deadline = asyncio.get_running_loop().time() + seconds
        while not self.rows("request_id = ?", request_id):
            assert asyncio.get_running_loop().time() < deadline, f"no audit row for {request_id}"
            await asyncio.sleep(0.05)
        return self.row(request_id)


@pytest.fixture(scope="module")
async def in_process(provider: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[
        Callable[..., Awaitable[InProcess]]]:
    """Start an app in process with the given proxy settings, as `proxy_factory` starts `morphguard serve` (the same
    config: the scripted provider as upstream and judge, the default detector); each app lives until the module's
    tests are done."""
    async with AsyncExitStack() as stack:
        async def make(policy: dict[str, Any] | None = None, detector: str = "auto",
                       **proxy: Any) -> InProcess:
            folder = tmp_path_factory.mktemp("inprocess")
            policy = dict(policy or {})
            policy["audit"] = {"path": str(folder / "audit.db"), **policy.get("audit", {})}
            config = Config.model_validate({
                "judge": {"model": "openai/judge", "api_base": provider, "api_key": "sk-judge", "max_attempts": 1},
                "detector": {"name": detector},
                "metarag": {"profile": "paper"},
                "proxy": {"upstream": {"base_url": provider, "timeout_s": 2, "max_attempts": 3}, **proxy},
                "policy": policy,
            })
            app = create_app(config)
            await stack.enter_async_context(lifespan(app))
            client = await stack.enter_async_context(httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url=BASE, timeout=30))
            client2 = await stack.enter_async_context(httpx2.AsyncClient(
                transport=httpx2.ASGITransport(app=app), base_url=BASE, timeout=30))
            return InProcess(client, client2, folder)

        yield make
