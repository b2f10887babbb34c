"""The README's test command is the one CI runs: a newcomer who types it runs what decides whether a change lands."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ci_runs_the_readmes_test_command():
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"^(\.venv/bin/pytest[^#\n]*?)\s*#", readme, flags=re.M)
    assert commands, "the README gives no test command"
    whole = commands[0].strip()  # the first is the whole suite; the others are tiers of it
    assert "-m" not in whole.split(), whole
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines() if "bin/pytest" in line]
    assert ci == [whole], (ci, whole)
