"""Model-backed: the proxy under uvicorn checking through the real embedded judge (marker `model`).

`serve --workers 2` with `judge.model: local` starts one llama.cpp server, which both proxy processes ask."""

from __future__ import annotations

import asyncio
import os

import httpx
import openai
import pytest

from morphguard.llm.local import usable_cpus
from tests.e2e.conftest import provider, proxy_factory  # noqa: F401  (fixtures: the proxy under uvicorn)
from tests.e2e.test_processes import PASSAGE, QUESTION, cmdline, descendants

pytestmark = pytest.mark.model


def test_the_embedded_judge_checks_through_the_proxy_one_judge_for_every_process(proxy_factory):  # noqa: F811
    base = proxy_factory(judge_model="local", processes=2)
    # a generous bound: a check on the CPU model takes seconds alone, far longer on a busy machine
    client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="sk-client", max_retries=0, timeout=600)

    async def burst() -> list:
        return await asyncio.gather(*(client.chat.completions.create(
            model="hallucinated", messages=[{"role": "user", "content": QUESTION}],
            extra_body={"morphguard": {"context": PASSAGE}}) for _ in range(2)))

    verdicts = [a.model_extra["morphguard"] for a in asyncio.run(burst())]
    assert all(v["checked"] and v["flagged"] for v in verdicts), verdicts
    checks = httpx.get(base + "/readyz", timeout=30).json()["checks"]
    assert checks == {"upstream": True, "judge": True, "queue": True, "store": True}
    below = descendants(proxy_factory.processes[base].pid)
    judges = [p for p in below if b"morphguard.llm.local" in cmdline(p)]
    assert len(judges) == 1  # started once by `serve`, asked by both processes
    # as many llama.cpp threads as CPUs the processes may use (one under parallel test workers), not the host's count
    args = cmdline(judges[0]).split(b"\0")
    threads = int(args[args.index(b"--threads") + 1])
    assert threads == usable_cpus() <= len(os.sched_getaffinity(0))
