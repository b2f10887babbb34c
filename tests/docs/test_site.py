"""The documentation site: the generated references say what the code does, and a strict build catches broken
links."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from morphguard import _docs
from morphguard.cli import _parser
from morphguard.config import DETECTOR_SECTIONS, Config
from tests.commands import morphguard

ROOT = Path(__file__).resolve().parents[2]


def _table(markdown: str) -> dict[str, list[str]]:
    """Rows of every table in a generated page, by their first cell (with its backticks)."""
    rows = {}
    for line in markdown.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            rows[cells[0]] = cells[1:]
    return rows


_UNSET = object()


def _value(config: Any, key: str) -> Any:
    """The default at `key`, or _UNSET below a section that is null by default (its fields' defaults apply once
    it is given)."""
    value = config
    for part in key.split("."):
        if value is None:
            return _UNSET
        value = value[part] if isinstance(value, dict) else getattr(value, part)
    return value


def test_yaml_comments_beside_below_and_above_a_key():
    text = (
        "# The section's intro.\n"
        "judge:\n"
        "  model: local        # the model\n"
        "                      # and its second line\n"
        "  # above the key\n"
        "  timeout_s: 120\n"
        "  url: 'a # b'        # the hash in quotes is part of the value\n"
    )
    comments, intros = _docs.yaml_comments(text)
    assert intros == {"judge": "The section's intro."}
    assert comments[("judge", "model")] == "The model and its second line."
    assert comments[("judge", "timeout_s")] == "Above the key."
    assert comments[("judge", "url")] == "The hash in quotes is part of the value."


def test_every_configuration_key_is_in_the_reference_with_its_default_and_a_description():
    page = _docs.config_reference(ROOT / "config.yaml")
    rows = _table(page)
    defaults = Config()
    keys = []
    for name, model, _ in _docs.sections(ROOT / "config.yaml"):
        keys += [r.key for r in _docs.rows(model, (name,), {})]
    assert {k.split(".")[0] for k in keys} == set(Config.model_fields) | set(DETECTOR_SECTIONS)
    undescribed = [k for k in keys if not rows[f"`{k}`"][2]]
    assert undescribed == [], "document these keys in config.yaml or beside their field"
    for key in keys:
        type_, default, _ = rows[f"`{key}`"]
        if "*" in key or not default.startswith("`") or default.endswith(("...`", "(below)")):
            continue
        expected = _value(defaults, key)
        if expected is _UNSET:
            continue
        assert json.loads(default.strip("`")) == _docs._plain(expected), key


def test_the_cli_reference_lists_every_option_that_help_prints():
    page = _docs.cli_reference()
    sections = page.split("\n## ")
    for name, _, sub in _docs._commands(_parser(), "morphguard"):
        section = next(s for s in sections if s.startswith(f"`{name}`"))
        shown = morphguard(*name.split()[1:], "--help", cwd=ROOT, env={"COLUMNS": "200"})
        assert shown.returncode == 0, shown.stderr
        help_text = shown.stdout
        for action in sub._actions:
            for flag in action.option_strings:
                if flag in ("-h", "--help"):
                    continue
                assert flag in help_text, (name, flag)
                assert f"`{flag}`" in section, (name, flag)
            if action.help and action.help != "==SUPPRESS==":
                assert " ".join(action.help.split()) in " ".join(help_text.split()), (name, action.dest)


def _mkdocs() -> str:
    pytest.importorskip("mkdocs", reason="the docs extra is not installed (pip install -e '.[docs]')")
    pytest.importorskip("material", reason="the docs extra is not installed (pip install -e '.[docs]')")
    return str(Path(sys.executable).with_name("mkdocs"))


def _build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([_mkdocs(), "build", "--strict", "--site-dir", str(site)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_site_builds_strictly_with_the_generated_pages(tmp_path):
    done = _build(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stderr[-3000:]
    config_page = (tmp_path / "site" / "reference" / "configuration" / "index.html").read_text(encoding="utf-8")
    assert "judge.model" in config_page and "policy.profiles.*.threshold" in config_page
    cli_page = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    assert "morphguard calibrate" in cli_page and "--target-recall" in cli_page


def test_a_broken_link_fails_the_build(tmp_path):
    copy = tmp_path / "repo"
    copy.mkdir()
    for name in ("mkdocs.yml", "config.yaml", "CHANGELOG.md"):
        shutil.copy(ROOT / name, copy / name)
    shutil.copytree(ROOT / "docs", copy / "docs")
    page = copy / "docs" / "troubleshooting.md"
    page.write_text(page.read_text(encoding="utf-8") + "\nSee [the missing page](no-such-page.md).\n",
                    encoding="utf-8")
    done = _build(copy, tmp_path / "site")
    assert done.returncode != 0
    assert "no-such-page.md" in done.stderr
