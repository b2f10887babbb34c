"""The audit promise under a failing disk: `morphguard serve` with its SQLite trail on a small loop-mounted
filesystem, filled to the last block while requests flow, then given room again.

Whatever the disk does, no client is answered before its row is committed: a request either gets its answer with
its row already in the trail, or a 503 `store_unavailable` with `Retry-After` (its row written once the disk has
room); no other 5xx; /readyz is 503 while the store cannot write and 200 again on its own."""

from __future__ import annotations

import errno
import os
import sqlite3
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import serve, stop

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PASSAGE = "Ibuprofen is contraindicated in the third trimester of pregnancy. " * 40  # rows that take room
QUESTION = "Can pregnant women take ibuprofen for back pain?"
CLIENTS = 4
PAUSE_S = 0.1  # between one client's requests: up to 40 requests a second in all
FAULT_AT_S = 3.0
FULL_FOR_S = 5.0
AFTER_S = 4.0


@contextmanager
def small_disk(folder: Path, megabytes: int = 12) -> Iterator[Path]:
    """An ext4 filesystem of its own, loop-mounted; skips where the sandbox cannot mount one."""
    image, mount = folder / "disk.img", folder / "disk"
    mount.mkdir()
    with open(image, "wb") as out:
        out.truncate(megabytes << 20)
    made = subprocess.run(["mkfs.ext4", "-q", str(image)], capture_output=True)
    mounted = made.returncode == 0 and subprocess.run(["mount", "-o", "loop", str(image), str(mount)],
                                                      capture_output=True).returncode == 0
    if not mounted:
        pytest.skip("cannot loop-mount a filesystem here (needs root and a loop device)")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(mount: Path) -> Path:
    """Write a file until the filesystem has no block left."""
    filler = mount / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        for size in (64 << 10, 4 << 10, 1 << 10):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return filler


def config(provider: str, audit: Path, mode: str) -> dict:
    return {
        "judge": {"model": "openai/judge", "api_base": provider, "api_key": "sk-judge", "max_attempts": 1},
        "detector": {"name": "direct"},
        "proxy": {"upstream": {"base_url": provider, "timeout_s": 5}, "mode": mode, "workers": 1,
                  "shutdown_grace_s": 1},
        "policy": {"profiles": {"general": {"action": "annotate", "escalate": False, "threshold": 0.5,
                                            "topics": {}}},
                   "audit": {"path": str(audit), "store_text": "full", "keep_text": "none", "wait_s": 1.0}},
    }


def row_of(audit: Path, marker: str) -> tuple[str, str | None] | None:
    with sqlite3.connect(f"file:{audit}?mode=ro", uri=True, timeout=10) as db:
        return db.execute("SELECT request_id, reason FROM decisions WHERE question LIKE ?",
                          (f"%{marker}%",)).fetchone()


@dataclass
class Run:
    statuses: Counter[int] = field(default_factory=Counter)
    unrecorded: list[str] = field(default_factory=list)  # answered 200 while their row was not in the trail
    refused: list[str] = field(default_factory=list)  # markers of the 503s
    answered: list[str] = field(default_factory=list)  # markers of the 200s
    bad: list[str] = field(default_factory=list)  # 5xx other than the documented 503, or a 503 without Retry-After
    ready: list[tuple[float, int]] = field(default_factory=list)  # (seconds into the run, /readyz status)


def load(base: str, audit: Path, mount: Path, stream: bool) -> Run:
    run, stop_at = Run(), time.monotonic() + FAULT_AT_S + FULL_FOR_S + AFTER_S
    lock = threading.Lock()

    def client() -> None:
        with httpx.Client(timeout=30) as http:
            while time.monotonic() < stop_at:
                marker = uuid.uuid4().hex
                body = {"model": "faithful", "stream": stream,
                        "messages": [{"role": "user", "content": f"{QUESTION} {marker}"}],
                        "morphguard": {"context": PASSAGE}}
                try:
                    response = http.post(base + "/v1/chat/completions", json=body)
                    text = response.text
                except httpx.HTTPError as exc:  # a broken response: counted, never the end of this client
                    with lock:
                        run.statuses[0] += 1
                        run.bad.append(f"{type(exc).__name__}: {exc}")
                    continue
                ok = response.status_code == 200 and ("error" not in text[:200] if not stream else
                                                      "store_unavailable" not in text and "[DONE]" in text)
                recorded = row_of(audit, marker) is not None if ok else None
                with lock:
                    run.statuses[response.status_code] += 1
                    if ok:
                        run.answered.append(marker)
                        if not recorded:
                            run.unrecorded.append(marker)
                    elif (response.status_code == 503 and response.headers.get("retry-after")
                          or stream and response.status_code == 200 and "store_unavailable" in text):
                        run.refused.append(marker)
                    else:
                        run.bad.append(f"{response.status_code} {text[:200]}")
                time.sleep(PAUSE_S)

    def probe(started: float) -> None:
        while time.monotonic() < stop_at + 10:
            try:
                status = httpx.get(base + "/readyz", timeout=5).status_code
            except httpx.HTTPError:
                status = 0
            run.ready.append((time.monotonic() - started, status))
            time.sleep(0.25)

    started = time.monotonic()
    threads = [threading.Thread(target=client) for _ in range(CLIENTS)] + [threading.Thread(target=probe,
                                                                                            args=(started,))]
    for thread in threads:
        thread.start()
    time.sleep(FAULT_AT_S)
    filler = fill(mount)
    time.sleep(FULL_FOR_S)
    filler.unlink()
    for thread in threads:
        thread.join()
    return run


def recovered_after(run: Run) -> float:
    """Seconds from the disk's room coming back to /readyz answering 200 again (-1: it did not)."""
    freed = FAULT_AT_S + FULL_FOR_S
    return min((t for t, status in run.ready if t >= freed and status == 200), default=freed - 1) - freed


def settle_rows(audit: Path, markers: list[str], within_s: float = 20) -> list[str]:
    """The markers whose row is still missing after `within_s`."""
    deadline = time.monotonic() + within_s
    missing = list(markers)
    while missing and time.monotonic() < deadline:
        missing = [m for m in missing if row_of(audit, m) is None]
        time.sleep(0.5)
    return missing


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_full_disk_under_the_sqlite_trail_answers_nothing_without_its_row(provider, tmp_path, stream):
    with small_disk(tmp_path) as mount:
        audit = mount / "audit.db"
        base, process = serve(config(provider, audit, "inline"), tmp_path)
        try:
            run = load(base, audit, mount, stream)
            missing = settle_rows(audit, run.refused)
        finally:
            stop(process)
        print(f"{'stream' if stream else 'plain'}: sent {sum(run.statuses.values())}, answered "
              f"{len(run.answered)}, refused {len(run.refused)}, answered without a row {len(run.unrecorded)}, "
              f"other errors {len(run.bad)}, statuses {dict(run.statuses)}, ready again {recovered_after(run):.1f} s "
              "after the disk had room")
        assert run.refused, "the disk filled up, yet no request waited in vain for its row"
        assert run.unrecorded == []  # no answer went out before its row was committed
        assert run.bad == []  # no 5xx but the documented 503 with Retry-After
        assert missing == []  # the refused requests' rows were written once the disk had room
        reasons = [row_of(audit, m) for m in run.refused]
        assert all("store_unavailable" in (reason or "") for _, reason in reasons)  # type: ignore[misc]
        not_ready = [t for t, status in run.ready if status == 503]
        assert not_ready and FAULT_AT_S <= min(not_ready)  # not ready while the store could not write
        assert run.ready[-1][1] == 200  # and ready again on its own, without a restart
        assert run.answered[-1] and row_of(audit, run.answered[-1])


def test_async_mode_on_a_full_disk_falls_back_and_never_answers_500(provider, tmp_path):
    with small_disk(tmp_path) as mount:
        audit = mount / "audit.db"
        base, process = serve(config(provider, audit, "async"), tmp_path)
        try:
            run = load(base, audit, mount, stream=False)
            missing = settle_rows(audit, run.answered + run.refused, within_s=60)
        finally:
            stop(process)
        print(f"async: sent {sum(run.statuses.values())}, answered {len(run.answered)}, refused "
              f"{len(run.refused)}, other errors {len(run.bad)}, statuses {dict(run.statuses)}, rows missing "
              f"{len(missing)}, ready again {recovered_after(run):.1f} s after the disk had room")
        assert run.bad == []  # never a 500: the queue's full disk is the queue unavailable
        assert missing == []  # every answered or refused request has its row in the end
        assert run.ready[-1][1] == 200
