"""Real processes on loopback for the gateway integrations: the scripted provider (the RAG model and the judge),
and `morphguard serve` with proxy keys and three profiles."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import provider, serve  # noqa: F401  (provider: the session fixture, shared with e2e)
from tests.servers import stop

KEY = "sk-proxy-check-0123"
CLINIC_KEY = "sk-clinic-check-0456"  # a proxy key of its own: its checks get the strict profile
PASSAGE = "Ibuprofen is contraindicated in the third trimester of pregnancy."
QUESTION = "Can pregnant women take ibuprofen for back pain?"
FAITHFUL = "Ibuprofen is contraindicated in the third trimester of pregnancy."
HALLUCINATED = "Ibuprofen is safe throughout pregnancy."
SAFE = "Please ask your midwife or doctor about medicines in pregnancy."


@pytest.fixture(scope="module")
def checker(provider, tmp_path_factory):  # noqa: F811
    """`morphguard serve` whose profile is chosen by `x-tenant`: `clinic` blocks, `marked` highlights; CLINIC_KEY's
    checks block too, and requests for an `internal-*` model pass unchecked by policy (action `pass`)."""
    folder = tmp_path_factory.mktemp("check")
    config = {
        "judge": {"model": "openai/judge", "api_base": provider, "api_key": "sk-judge", "max_attempts": 1},
        "detector": {"name": "auto"},
        "proxy": {"upstream": {"base_url": provider, "timeout_s": 2}, "keys": [KEY, CLINIC_KEY]},
        "policy": {
            "profiles": {"general": {"threshold": 0.5, "action": "annotate", "topics": {}},
                         "strict": {"threshold": 0.5, "action": "block", "topics": {}, "safe_message": SAFE},
                         "marked": {"threshold": 0.5, "action": "highlight", "topics": {}},
                         "open": {"threshold": 0.5, "action": "pass", "topics": {}}},
            "routes": [{"profile": "open", "models": ["internal-*"]},
                       {"profile": "strict", "api_keys": [CLINIC_KEY]},
                       {"profile": "strict", "headers": {"x-tenant": "clinic"}},
                       {"profile": "marked", "headers": {"x-tenant": "marked"}}],
            "highlight": {"open": "[!", "close": "!]"},
            "audit": {"path": str(folder / "audit.db"), "store_text": "full"},
        },
    }
    base, process = serve(config, folder)
    yield base, folder
    stop(process)


def gateway_config(base_url: str, folder: Path, judge: str = "openai/judge") -> dict[str, Any]:
    """`morphguard serve` for the live gateways: profiles chosen by `x-tenant` (`strict` blocks; `closed` and `open`
    block too, with a 1 s latency budget, failing closed and open), `general` annotates."""
    return {
        "judge": {"model": judge, "api_base": base_url, "api_key": "sk-judge", "max_attempts": 1, "timeout_s": 10},
        "detector": {"name": "auto"},
        "proxy": {"upstream": {"base_url": base_url, "timeout_s": 2}, "keys": [KEY]},
        "policy": {
            "profiles": {
                "general": {"threshold": 0.5, "action": "annotate", "topics": {}},
                "strict": {"threshold": 0.5, "action": "block", "topics": {}, "safe_message": SAFE},
                "closed": {"threshold": 0.5, "action": "block", "topics": {}, "safe_message": SAFE,
                           "on_error": "fail_closed", "latency_budget_s": 1},
                "open": {"threshold": 0.5, "action": "block", "topics": {}, "safe_message": SAFE,
                         "on_error": "fail_open", "latency_budget_s": 1},
            },
            "routes": [{"profile": name, "headers": {"x-tenant": name}} for name in ("strict", "closed", "open")],
            "audit": {"path": str(folder / "audit.db"), "store_text": "full"},
        },
    }


@pytest.fixture(scope="module")
def webhook(provider, tmp_path_factory):  # noqa: F811
    """`morphguard serve` as the live gateways call it."""
    folder = tmp_path_factory.mktemp("webhook")
    base, process = serve(gateway_config(provider, folder), folder)
    yield base, folder
    stop(process)


@pytest.fixture(scope="module")
def slow_webhook(provider, tmp_path_factory):  # noqa: F811
    """The same, with a judge that takes 3 s a call: no check ends within the 1 s budget."""
    folder = tmp_path_factory.mktemp("slow-webhook")
    base, process = serve(gateway_config(provider, folder, judge="openai/slow-judge"), folder)
    yield base, folder
    stop(process)


def rows(folder: Path) -> dict[str, dict]:
    """The audit rows by request id (none before the first is written)."""
    if not (folder / "audit.db").exists():
        return {}
    with sqlite3.connect(folder / "audit.db") as db:
        if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'decisions'").fetchone() is None:
            return {}
        db.row_factory = sqlite3.Row
        return {r["request_id"]: dict(r) for r in db.execute("SELECT * FROM decisions")}
