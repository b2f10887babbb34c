"""The suite's own time limit: a test that hangs fails with its traceback, in one process and under workers, and
the limit is the one pyproject.toml sets."""

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


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one-process", "two-workers"])
def test_a_hanging_test_fails_with_its_traceback(tmp_path, workers):
    (tmp_path / "test_hangs.py").write_text(HANGS)
    # the two plug-ins the limit rests on, and none of the others the environment installs (seconds of imports each)
    plugins = ["-p", "timeout", "-p", "xdist.plugin"]
    done = subprocess.run([sys.executable, "-m", "pytest", *plugins, "-p", "no:cacheprovider", "-o", "timeout=2",
                           "--rootdir", str(tmp_path), *workers, str(tmp_path / "test_hangs.py")],
                          capture_output=True, text=True, cwd=tmp_path, timeout=240,
                          env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "Timeout" in out and "1 failed" in out
    assert "threading.Event().wait()" in out  # where it hung, from the test's own frame
