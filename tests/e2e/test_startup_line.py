"""`morphguard serve` says in one line, at start, where it listens and with what: the config file, profiles, the
check and its judge, the upstream and the stores, never a credential."""

from __future__ import annotations

import re

from tests.e2e.conftest import serve, stop


def test_serve_logs_one_line_with_what_it_serves(provider, tmp_path):
    config = {
        "judge": {"model": "openai/judge", "api_base": provider, "api_key": "sk-judge-secret"},
        "detector": {"name": "metarag"},
        "proxy": {"upstream": {"base_url": provider}},
        "policy": {"audit": {"path": str(tmp_path / "audit.db")},
                   "profiles": {"general": {}, "clinical": {"threshold": 0.3}}},
    }
    base, process = serve(config, tmp_path)
    stop(process)
    log = (tmp_path / "proxy.log").read_text()
    lines = [line for line in log.splitlines() if "morphguard proxy on" in line]
    assert len(lines) == 1, log
    (line,) = lines
    assert f"morphguard proxy on {base}/v1;" in line
    assert f"config {tmp_path / 'config.yaml'};" in line
    assert set(re.search(r"; profiles ([^;]*);", line).group(1).split(", ")) == {"general", "clinical"}
    assert f"check metarag with judge openai/judge at {provider};" in line
    assert f"upstream {provider};" in line and f"audit sqlite {tmp_path / 'audit.db'};" in line
    assert "queue embedded sqlite" in line
    assert "sk-judge-secret" not in log
