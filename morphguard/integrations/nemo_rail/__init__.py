"""morphguard as an output rail of NeMo Guardrails: the config folder NeMo users copy (or point
`RailsConfig.from_path` at), holding the rail's flow (`rails.co`), its action (`actions.py`) and the settings
(`config.yml`).

The action runs in NeMo's own process and needs only NeMo and httpx: it calls a running `morphguard serve` at
`POST /v1/check` with NeMo's `$user_message`, `$relevant_chunks` and `$bot_message`, and so does not import
morphguard (NeMo's dependencies and ours need not share a virtualenv).
"""

from pathlib import Path

FOLDER = Path(__file__).resolve().parent
