"""The suite's own time limit: a test that hangs fails with its traceback, in one process and under workers, and
the limit is the one pyproject.toml sets; and its units of work under workers: a file, or the model-backed folder."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HANGS = '''
import threading


def test_waits_for_what_never_comes():
    threading.Event().wait()
'''


def test_pyproject_sets_a_time_limit_for_every_test():
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert 0 < int(options["timeout"]) <= 600
    assert "--dist loadfile" in options["addopts"]


def pytest_in(folder: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """pytest run in `folder` with the plug-ins the suite's limits and units rest on, and none of the others the
    environment installs (seconds of imports each)."""
    plugins = ["-p", "timeout", "-p", "xdist.plugin"]
    return subprocess.run([sys.executable, "-m", "pytest", *plugins, "-p", "no:cacheprovider", "--rootdir",
                           str(folder), *args], capture_output=True, text=True, cwd=folder, timeout=240,
                          env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONPATH": str(ROOT), **env})


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one-process", "two-workers"])
def test_a_hanging_test_fails_with_its_traceback(tmp_path, workers):
    (tmp_path / "test_hangs.py").write_text(HANGS)
    done = pytest_in(tmp_path, "-o", "timeout=2", *workers, str(tmp_path / "test_hangs.py"))
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "Timeout" in out and "1 failed" in out
    assert "threading.Event().wait()" in out  # where it hung, from the test's own frame


WHERE = '''
import os

import pytest


@pytest.mark.parametrize("n", range(4))
def test_runs(n):
    with open(os.environ["RAN"], "a") as ran:
        ran.write(f"{__file__} {os.environ['PYTEST_XDIST_WORKER']}\\n")
'''


def test_under_workers_a_file_is_one_unit_of_work_and_so_is_the_model_backed_folder(tmp_path):
    """The suite's scheduler (tests/conftest.py) hands out whole units: a file's tests, and all the model-backed
    tests, run in one worker."""
    (tmp_path / "conftest.py").write_text("from tests.conftest import pytest_xdist_make_scheduler  # noqa: F401\n")
    for path in ("tests/model/test_one.py", "tests/model/test_two.py", "tests/test_three.py", "tests/test_four.py",
                 "tests/test_five.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(WHERE)
    ran = tmp_path / "ran.txt"
    done = pytest_in(tmp_path, "-n", "2", "--dist", "loadfile", "tests", RAN=str(ran))
    assert done.returncode == 0, done.stdout + done.stderr
    workers: dict[str, set[str]] = {}
    for line in ran.read_text().splitlines():
        module, worker = line.split()
        workers.setdefault("model" if "/tests/model/" in module else module, set()).add(worker)
    assert len(workers) == 4 and all(len(w) == 1 for w in workers.values()), workers
    assert len(set().union(*workers.values())) == 2  # the units were spread over both workers
