"""`morphguard` commands run inside the test's own process, for tests of what a command computes, writes and prints.

A process of its own costs seconds of imports (litellm, scikit-learn, matplotlib) that the test process has already
paid. Where the process is what is tested (its exit, what it logs, a server it starts), tests/forked.py runs the
command in a process of its own."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

from morphguard.cli import main


def morphguard(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`morphguard *args` run in `cwd` with `env` added to the environment: its exit code and what it printed."""
    out, err = io.StringIO(), io.StringIO()
    with _inside(cwd, env or {}), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse: --help, and a usage error
            code = exc.code if isinstance(exc.code, int) else 2
    return subprocess.CompletedProcess(["morphguard", *args], code, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def _inside(cwd: Path, env: dict[str, str]) -> Iterator[None]:
    """In `cwd`, with `env` set, and the command's own setting of litellm's handler undone afterwards."""
    before = os.getcwd()
    changed = {**env, "EXPERIMENTAL_OPENAI_BASE_LLM_HTTP_HANDLER": None}
    saved = {name: os.environ.get(name) for name in changed}
    os.environ.update(env)
    os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(before)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
