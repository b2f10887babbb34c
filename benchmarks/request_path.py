"""What one non-streamed chat completion runs of morphguard, from the server to the audit row's write.

The proxy serves under uvicorn in this process's event loop (the `grounding` detector: no judge) in front of a
scripted upstream on loopback (tests/scripted_llm.py); after one warm-up request, one request runs with a profiler
on the loop's thread. Counted: every call of a function whose code lives in morphguard/ (detectors/ and llm/ apart:
the check itself), the distinct functions and modules among them, and the morphguard frames on the stack when the
audit row is handed to its writer (`AuditWriter.write`): the stages from the route to the audit write. Counts, not
times: the same on any machine. Prints JSON.

    python benchmarks/request_path.py
"""

from __future__ import annotations

import asyncio
import collections
import json
import sys
import tempfile
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import httpx
import uvicorn

import morphguard
from morphguard.config import Config
from morphguard.proxy.app import create_app
from tests.scripted_llm import ScriptedLLM

ROOT = str(Path(morphguard.__file__).parent)
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


if __name__ == "__main__":
    print(json.dumps(asyncio.run(measure()), indent=1))
