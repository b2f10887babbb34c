"""The embedded judge: a llama.cpp OpenAI-compatible server on 127.0.0.1 that we start and stop.

The server runs in a child process (`python -m morphguard.llm.local ...`) built on the prebuilt
`xllamacpp` wheel, so a crash or a hang in native code never takes the caller down and stopping it
is a plain signal. The prompt cache of llama.cpp stays on: verify prompts put the passages first, so
every verify call of one answer reuses the already computed prefix.
"""

from __future__ import annotations

import argparse
import atexit
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from morphguard.config import LocalModelSettings
from morphguard.errors import JudgeStartError
from morphguard.llm.weights import ensure_model

log = logging.getLogger(__name__)

LOCAL_MODEL = "local"


class LocalJudge:
    """A running llama.cpp server; `base_url` is its OpenAI-compatible `/v1` root."""

    def __init__(self, settings: LocalModelSettings) -> None:
        self.settings = settings
        self.base_url: str | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._log_path: Path | None = None

    def start(self) -> str:
        if self.base_url:
            return self.base_url
        model = ensure_model(self.settings)
        port = free_port()
        threads = self.settings.threads or max(1, os.cpu_count() or 1)
        fd, log_name = tempfile.mkstemp(prefix="morphguard-judge-", suffix=".log")
        self._log_path = Path(log_name)
        cmd = [sys.executable, "-m", "morphguard.llm.local", "--model", str(model), "--port", str(port),
               "--ctx", str(self.settings.context_size * self.settings.parallel), "--threads", str(threads),
               "--parallel", str(self.settings.parallel)]
        with os.fdopen(fd, "wb") as out:
            self._process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        self._wait_ready(url)
        self.base_url = url + "/v1"
        log.info("embedded judge ready at %s (model %s)", self.base_url, model.name)
        return self.base_url

    def _wait_ready(self, url: str) -> None:
        deadline = time.monotonic() + self.settings.startup_timeout_s
        assert self._process is not None
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise JudgeStartError(f"the embedded judge exited with code {self._process.returncode}:\n"
                                      f"{self._log_tail()}")
            try:
                if httpx.get(url + "/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        self.stop()
        raise JudgeStartError(f"the embedded judge was not ready after {self.settings.startup_timeout_s:.0f} s:\n"
                              f"{self._log_tail()}")

    def _log_tail(self, lines: int = 15) -> str:
        if not self._log_path or not self._log_path.exists():
            return ""
        return "\n".join(self._log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        process, self._process, self.base_url = self._process, None, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._log_path:
            self._log_path.unlink(missing_ok=True)

    def __enter__(self) -> LocalJudge:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


_shared: dict[str, LocalJudge] = {}
_shared_lock = threading.Lock()


def shared_judge(settings: LocalModelSettings) -> LocalJudge:
    """One started judge per distinct settings for the whole process, stopped at exit."""
    key = settings.model_dump_json()
    with _shared_lock:
        judge = _shared.get(key)
        if judge is None:
            judge = _shared[key] = LocalJudge(settings)
            atexit.register(judge.stop)
        judge.start()
        return judge


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="morphguard's embedded llama.cpp server (internal)")
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ctx", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--parallel", type=int, default=1)
    args = parser.parse_args(argv)

    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.hostnames = ["127.0.0.1"]
    params.port = args.port
    params.n_ctx = args.ctx
    params.n_parallel = args.parallel
    params.cache_prompt = True
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    server = xllamacpp.Server(params)  # serves HTTP on its own threads until the process ends
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    parent = os.getppid()
    # A parent killed outright (SIGKILL) cannot stop us: notice it is gone rather than serve on as an orphan.
    while not stop.wait(1.0):
        if os.getppid() != parent:
            break
    del server


if __name__ == "__main__":
    _serve()
