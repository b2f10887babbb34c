"""`morphguard` commands as processes of their own, forked from a server that has already imported morphguard.

A real process over a real socket, as `python -m morphguard.cli` would be, without paying its imports again: each
fresh interpreter spends about two seconds of CPU importing litellm alone, and the proxy's tests start dozens of
proxies. The fork server is multiprocessing's (`forkserver`), started once per test process with what
tests/preloaded.py loads; each command's process is forked from it, takes the caller's environment, working folder
and CPU mask, and writes what it prints to a log file. tests/test_cli.py starts its servers from a fresh interpreter,
as a deployment does.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
from multiprocessing.context import ForkServerContext
from multiprocessing.process import BaseProcess
from pathlib import Path

_context: ForkServerContext | None = None
_running: list[BaseProcess] = []


def _fork_server() -> ForkServerContext:
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(["tests.preloaded"])
        atexit.register(_stop_survivors)
    return _context


class Forked:
    """The forked command, with the part of `subprocess.Popen`'s interface the tests use."""

    def __init__(self, process: BaseProcess, args: list[str]) -> None:
        self._process, self.args = process, args

    @property
    def pid(self) -> int:
        assert self._process.pid is not None
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode  # as Popen's: -N when signal N ended it

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self._process.exitcode

    def send_signal(self, sig: int) -> None:
        if self._process.exitcode is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def fork_command(args: list[str], log: Path, cwd: Path, env: dict[str, str] | None = None,
                 err: Path | None = None) -> Forked:
    """`morphguard *args` in a forked process, in `cwd` with `env` added to this process's environment, printing to
    `log` (its errors too, unless `err` is given)."""
    for path in {log, err or log}:
        path.write_bytes(b"")  # there, empty, as soon as this returns
    process = _fork_server().Process(
        target=_run, args=(args, str(log), str(err or log), str(cwd), {**os.environ, **(env or {})},
                           os.sched_getaffinity(0)),
        name="morphguard " + " ".join(args[:1]))
    process.start()
    _running.append(process)
    return Forked(process, ["morphguard", *args])


def run_command(args: list[str], cwd: Path, env: dict[str, str] | None = None,
                timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`morphguard *args` forked and waited for, as `subprocess.run(..., capture_output=True, text=True)` gives it."""
    with tempfile.TemporaryDirectory() as folder:
        out, err = Path(folder) / "stdout", Path(folder) / "stderr"
        process = fork_command(args, out, cwd, env, err=err)
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
        return subprocess.CompletedProcess(process.args, code, out.read_text(), err.read_text())


def _run(args: list[str], log: str, err: str, cwd: str, env: dict[str, str], cpus: set[int]) -> None:
    """In the forked process: the caller's surroundings, then the command; its exit code is the process's."""
    for fd, path in enumerate((log, err) if err != log else (log,), start=1):
        opened = os.open(path, os.O_WRONLY | os.O_APPEND)
        os.dup2(opened, fd)
        os.close(opened)
    if err == log:
        os.dup2(1, 2)
    stdin = os.open(os.devnull, os.O_RDONLY)  # at fd 0, where uvicorn's worker processes look for it
    os.dup2(stdin, 0)
    os.close(stdin)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 (the process's own stdin, open for its life)
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    os.sched_setaffinity(0, cpus)
    sys.argv = ["morphguard", *args]
    Path("/proc/self/comm").write_text(f"mg-{args[0]}"[:15])  # its name in ps and top: mg-serve, mg-worker
    from morphguard.cli import main

    sys.exit(main(args))


def _stop_survivors() -> None:
    """At the test process's exit, before multiprocessing waits for its children: none is left running."""
    for process in _running:
        if process.exitcode is None:
            process.kill()
            process.join(5)
