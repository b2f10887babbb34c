"""Where the live tests find the gateways `.ci/run` installs beside the project: Portkey's open-source gateway (npm,
in `.gateways/`) and NeMo Guardrails (PyPI, in its own virtualenv `.venv-nemo`, since its dependencies are many and
not ours). Outside CI a missing gateway skips its tests with one line saying so; under CI (CI=true) it fails them."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.servers import missing

ROOT = Path(__file__).resolve().parents[2]
PORTKEY_VERSION = "1.15.2"
NEMO_VERSION = "0.24.1"


def _missing(what: str, how: str) -> None:
    missing(f"{what} is not installed ({how})")


def portkey_gateway() -> list[str]:
    """The command that runs Portkey's gateway bound to loopback only (its own server binds every interface):
    node with `docs/gateways/portkey-loopback.mjs` loaded first."""
    script = ROOT / ".gateways" / "node_modules" / "@portkey-ai" / "gateway" / "build" / "start-server.js"
    node = shutil.which("node")
    if node is None or not script.exists():
        _missing("Portkey's gateway", f"npm install --prefix .gateways @portkey-ai/gateway@{PORTKEY_VERSION}")
    return [str(node), "--import", str(ROOT / "docs" / "gateways" / "portkey-loopback.mjs"), str(script)]


def nemo_python() -> str:
    """The Python of NeMo Guardrails' own virtualenv."""
    python = ROOT / ".venv-nemo" / "bin" / "python"
    if not python.exists():
        _missing("NeMo Guardrails", f"python3 -m venv .venv-nemo && .venv-nemo/bin/pip install "
                 f"nemoguardrails=={NEMO_VERSION}")
    return str(python)
