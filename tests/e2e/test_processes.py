"""`morphguard serve --workers N`: several proxy processes on one port, one audit trail, nothing lost."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import openai
import pytest
import yaml

from tests.e2e.conftest import ROOT
from tests.forked import run_command

PASSAGE = "Ibuprofen is contraindicated in the third trimester of pregnancy."
QUESTION = "Can pregnant women take ibuprofen for back pain?"


def children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


@pytest.mark.slow  # ten seconds or more of its own
def test_several_processes_check_and_audit_every_request_once(proxy_factory):
    base = proxy_factory(processes=2)
    folder = proxy_factory.folders[base]
    client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="sk-client", max_retries=0, timeout=60)

    async def burst() -> list:
        gate = asyncio.Semaphore(16)

        async def one(n: int):
            async with gate:
                return await client.chat.completions.create(
                    model="faithful", messages=[{"role": "user", "content": f"{QUESTION} ({n})"}],
                    extra_body={"morphguard": {"context": PASSAGE}})

        return await asyncio.gather(*(one(n) for n in range(60)))

    answers = asyncio.run(burst())
    verdicts = [a.model_extra["morphguard"] for a in answers]
    assert all(v["checked"] for v in verdicts)
    with sqlite3.connect(folder / "audit.db") as db:
        audited = [r[0] for r in db.execute("SELECT request_id FROM decisions")]
    assert sorted(audited) == sorted(v["request_id"] for v in verdicts)  # each once, none lost
    # the requests were served by worker processes of the one `serve` (its children, besides a resource tracker)
    parent = proxy_factory.processes[base].pid
    workers = [c for c in children(parent) if b"spawn_main" in cmdline(c)]
    assert len(workers) == 2


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # it has exited meanwhile
        return b""


def descendants(pid: int) -> list[int]:
    found, frontier = [], [pid]
    while frontier:
        below = children(frontier.pop())
        found += below
        frontier += below
    return found


def test_async_checks_over_several_processes_need_the_shared_queue(tmp_path, provider):
    config = {"proxy": {"upstream": {"base_url": provider}, "mode": "async"},
              "judge": {"model": "openai/judge", "api_base": provider},
              "policy": {"audit": {"path": str(tmp_path / "audit.db")}}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    done = run_command(["serve", "--config", str(tmp_path / "config.yaml"), "--port", "0", "--workers", "2"], cwd=ROOT,
                       timeout=60)
    assert done.returncode != 0
    assert "queue.url" in done.stderr and "Traceback" not in done.stderr
