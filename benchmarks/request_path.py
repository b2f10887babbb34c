"""What one non-streamed chat completion runs of morphguard, from the server to the audit row's write.

The proxy serves under uvicorn in this process's event loop (the `grounding` detector: no judge) in front of a
scripted upstream on loopback (tests/scripted_llm.py); after one warm-up request, one request runs with a profiler
on the loop's thread. Counted: every call of a function whose code lives in morphguard/ (detectors/ and llm/ apart:
the check itself), the distinct functions and modules among them, and the morphguard frames on the stack when the
audit row is handed to its writer (`AuditWriter.write`): the stages from the route to the audit write. Counts, not
times: the same on any machine. Prints JSON.

    python benchmarks/request_path.py

`--profile N`: where the CPU of a request with checks off goes (no context source, the request forwarded and
audited, as benchmarks/proxy_overhead.py serves it; `--no-audit` without the audit trail). N requests, one at a
time from a client in another process, with cProfile on the loop's thread counting that thread's CPU time; each
function's own time is summed by where its code lives (a library, or a morphguard module), and a C function's
(a SQLite call, a socket write) goes to the Python code that called it. Times under a profiler, which slows
Python calls more than C work: the shares rank the costs, the absolute figures are the profiler's.

    python benchmarks/request_path.py --profile 2000 [--no-audit]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import json
import pstats
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import httpx
import uvicorn
import uvloop

import morphguard
from morphguard.config import Config
from morphguard.proxy.app import create_app
from morphguard.server import HttpProtocol
from tests.scripted_llm import ScriptedLLM

ROOT = str(Path(morphguard.__file__).parent)
SITE = str(Path(uvicorn.__file__).parent.parent)
STDLIB = sysconfig.get_paths()["stdlib"]
PASSAGE = "Ibuprofen is contraindicated in the third trimester of pregnancy."


def _module(code: CodeType) -> str:
    return code.co_filename[len(ROOT) + 1:-3].replace("/", ".")


def _counted(code: CodeType) -> bool:
    name = code.co_filename
    return name.startswith(ROOT) and not name.startswith((ROOT + "/detectors", ROOT + "/llm"))


async def measure() -> dict[str, Any]:
    with ScriptedLLM(lambda body: "Ibuprofen is safe throughout pregnancy.") as llm, \
            tempfile.TemporaryDirectory() as folder:
        config = Config.model_validate({"detector": {"name": "grounding"},
                                        "proxy": {"upstream": {"base_url": llm.base_url}},
                                        "policy": {"audit": {"path": folder + "/audit.db"}},
                                        "telemetry": {"exporter": "none"}})
        server = uvicorn.Server(uvicorn.Config(create_app(config), host="127.0.0.1", port=0, log_level="warning"))
        serving = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.05)
        port = server.servers[0].sockets[0].getsockname()[1]
        body = {"model": "m", "messages": [{"role": "user", "content": "Can pregnant women take ibuprofen?"}],
                "morphguard": {"context": [PASSAGE]}}
        calls: collections.Counter[tuple[str, str]] = collections.Counter()
        chain: list[str] = []

        def profile(frame: FrameType, event: str, arg: Any) -> None:
            if event != "call" or not _counted(frame.f_code):
                return
            calls[(_module(frame.f_code), frame.f_code.co_qualname)] += 1
            if frame.f_code.co_qualname == "AuditWriter.write" and not chain:
                at: FrameType | None = frame
                while at is not None:
                    if _counted(at.f_code):
                        chain.insert(0, f"{_module(at.f_code)}:{at.f_code.co_qualname}")
                    at = at.f_back

        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            headers = {"authorization": "Bearer sk-client"}
            await client.post("/v1/chat/completions", json=body, headers=headers)
            sys.setprofile(profile)
            try:
                response = await client.post("/v1/chat/completions", json=body, headers=headers)
            finally:
                sys.setprofile(None)
        assert response.status_code == 200, response.text
        server.should_exit = True
        await serving
    return {"calls": sum(calls.values()), "functions": len(calls), "modules": len({m for m, _ in calls}),
            "stages_to_audit_write": len(chain), "stages": chain}


# The client of `--profile`: requests one at a time over one kept-alive connection, in its own process.
CLIENT = """
import sys, httpx
body = {"model": "m", "messages": [{"role": "user", "content": "<context>The Eiffel Tower is in Paris.</context>\\n"
                                                        "Where is the Eiffel Tower?"}]}
with httpx.Client(base_url=sys.argv[1], headers={"authorization": "Bearer sk-client"}) as client:
    for _ in range(int(sys.argv[2])):
        assert client.post("/v1/chat/completions", json=body).status_code == 200
"""


def _where(code: tuple[str, int, str]) -> str:
    """Where a function's code lives: a morphguard module, a library, the standard library, or a C function."""
    path = code[0]
    if path.startswith(ROOT):
        return "morphguard." + path[len(ROOT) + 1:-3].replace("/", ".")
    if path.startswith(SITE):
        return path[len(SITE) + 1:].split("/")[0].removesuffix(".py")
    if path.startswith(STDLIB):
        return "python:" + path[len(STDLIB) + 1:].split("/")[0].removesuffix(".py")
    return "C" if path == "~" else path


async def profile(requests: int, audit: bool) -> dict[str, Any]:
    with ScriptedLLM(lambda body: "The Eiffel Tower is in Paris.") as llm, tempfile.TemporaryDirectory() as folder:
        config = Config.model_validate({"detector": {"name": "grounding"},
                                        "proxy": {"upstream": {"base_url": llm.base_url}, "context": {"sources": []}},
                                        "policy": {"audit": {"path": folder + "/audit.db", "enabled": audit}},
                                        "telemetry": {"exporter": "none"}})
        server = uvicorn.Server(uvicorn.Config(create_app(config), host="127.0.0.1", port=0, log_level="warning",
                                               http=HttpProtocol))
        serving = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.05)
        base = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"

        async def send(count: int) -> None:
            client = await asyncio.create_subprocess_exec(sys.executable, "-c", CLIENT, base, str(count))
            assert await client.wait() == 0

        await send(200)  # warm-up
        profiler = cProfile.Profile(time.thread_time)
        profiler.enable()
        await send(requests)
        profiler.disable()
        server.should_exit = True
        await serving
    stats: dict[Any, Any] = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    spent: collections.Counter[str] = collections.Counter()
    for code, (_, _, own, _, callers) in stats.items():
        where = _where(code)
        if where != "C" or not callers:
            spent[where] += own
            continue
        called = sum(c[2] for c in callers.values()) or 1.0  # a C function's time, shared among its callers
        for caller, (_, _, by_caller, _) in callers.items():
            spent[_where(caller)] += own * by_caller / called
    total = sum(spent.values())
    return {"requests": requests, "audit": audit, "loop_cpu_us_per_request_profiled": round(total * 1e6 / requests, 1),
            "shares": {where: round(t / total, 4) for where, t in spent.most_common(25)}}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", type=int, metavar="N", help="profile the CPU of N requests with checks off")
    parser.add_argument("--no-audit", action="store_true", help="with --profile: without the audit trail")
    args = parser.parse_args()
    # the profile on the event loop `serve` runs (uvloop), the counts on asyncio's: its calls are not counted anyway
    result = uvloop.run(profile(args.profile, not args.no_audit)) if args.profile else asyncio.run(measure())
    print(json.dumps(result, indent=1))
