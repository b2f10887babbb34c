"""MkDocs hook: the pages generated from the code (configuration and CLI references) and the changelog, made
afresh at every build so that they cannot drift from what they describe."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

from morphguard import _docs


def on_files(files: Files, config: Any) -> Files:
    root = Path(config["config_file_path"]).parent
    pages = {
        "reference/configuration.md": _docs.config_reference(root / "config.yaml"),
        "reference/cli.md": _docs.cli_reference(),
        "changelog.md": (root / "CHANGELOG.md").read_text(encoding="utf-8"),
    }
    for uri, content in pages.items():
        files.append(File.generated(config, uri, content=content))
    return files
