"""The embedded judge: a llama.cpp OpenAI-compatible server on 127.0.0.1 that we start and stop.

The server runs in a child process (`python -m morphguard.llm.local ...`) built on the prebuilt
`xllamacpp` wheel, so a crash or a hang in native code never takes the caller down and stopping it
is a plain signal. The prompt cache of llama.cpp stays on: verify prompts put the passages first, so
every verify call of one answer reuses the already computed prefix.

A watchdog thread restarts a server that died (killed, crashed) on the same port, with backoff, so
checks resume without restarting the proxy; meanwhile they fail as the profile's `on_error` says.
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

from morphguard import telemetry
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
        self.restarts = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._log_path: Path | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()

    def start(self) -> str:
        if self.base_url:
            return self.base_url
        if self.settings.base_url:  # another process runs it and keeps it alive
            self.base_url = self.settings.base_url
            return self.base_url
        port = free_port()
        self._launch(port)
        self.base_url = f"http://127.0.0.1:{port}/v1"
        self._stopping.clear()
        threading.Thread(target=self._watch, args=(port,), name="judge-watchdog", daemon=True).start()
        return self.base_url

    def _launch(self, port: int) -> None:
        model = ensure_model(self.settings)
        threads = self.settings.threads or usable_cpus()
        fd, log_name = tempfile.mkstemp(prefix="morphguard-judge-", suffix=".log")
        if self._log_path:
            self._log_path.unlink(missing_ok=True)
        self._log_path = Path(log_name)
        cmd = [sys.executable, "-m", "morphguard.llm.local", "--model", str(model), "--port", str(port),
               "--ctx", str(self.settings.context_size * self.settings.parallel), "--threads", str(threads),
               "--parallel", str(self.settings.parallel)]
        with os.fdopen(fd, "wb") as out:
            self._process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             start_new_session=True)
        self._wait_ready(f"http://127.0.0.1:{port}")
        log.info("embedded judge ready on port %d (model %s)", port, model.name)

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def _watch(self, port: int) -> None:
        """Restart the server on its port whenever it has died, waiting longer after each failed start."""
        delay = 1.0
        while not self._stopping.wait(1.0):
            with self._lock:
                if self._stopping.is_set() or self.alive:
                    delay = 1.0
                    continue
                code = self._process.returncode if self._process is not None else None
                log.error("embedded judge exited (code %s); restarting in %.0f s", code, delay)
            if self._stopping.wait(delay):
                return
            with self._lock:
                if self._stopping.is_set():
                    return
                try:
                    self._launch(port)
                    self.restarts += 1
                    telemetry.judge_restarted()
                except Exception:
                    log.exception("embedded judge restart failed")
                    delay = min(self.settings.restart_max_s, delay * 2)

    def _wait_ready(self, url: str) -> None:
        deadline = time.monotonic() + self.settings.startup_timeout_s
        assert self._process is not None
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise JudgeStartError(f"the embedded judge exited with code {self._process.returncode}:\n"
                                      f"{self._log_tail()}")
            try:
                with telemetry.untraced():
                    if httpx.get(url + "/health", timeout=2.0).status_code == 200:
                        return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        self._process.kill()
        raise JudgeStartError(f"the embedded judge was not ready after {self.settings.startup_timeout_s:.0f} s:\n"
                              f"{self._log_tail()}")

    def _log_tail(self, lines: int = 15) -> str:
        if not self._log_path or not self._log_path.exists():
            return ""
        return "\n".join(self._log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        self._stopping.set()
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


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask, capped by a container's CPU quota (cgroup), not the
    host's count. llama.cpp's threads wait for each other at every layer, so one more thread than there are CPUs to
    run it stalls all of them (loky's count, the one joblib uses, reads the quota)."""
    from joblib.externals.loky import cpu_count

    return max(1, int(cpu_count()))


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
