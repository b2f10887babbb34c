"""The console mounted in `morphguard serve` (review.mount_in_serve): under /review on the proxy's port,
over the proxy's own audit store, while the API routes stay as they are."""

from __future__ import annotations

import httpx

from tests.e2e.conftest import serve, stop
from tests.review.conftest import csrf_of


def test_the_console_mounted_in_serve_reads_the_proxys_store(tmp_path):
    config = {"proxy": {"upstream": {"base_url": "http://127.0.0.1:9/v1"}},
              "policy": {"audit": {"path": str(tmp_path / "audit.db")}},
              "detector": {"name": "length"},
              "review": {"mount_in_serve": True, "secure_cookies": False, "reviewers": {"alice": "k"}}}
    base, process = serve(config, tmp_path)
    try:
        with httpx.Client(base_url=base, timeout=10) as client:
            login = client.get("/review/login")
            assert login.status_code == 200 and 'action="/review/login"' in login.text
            done = client.post("/review/login", data={"csrf": csrf_of(login.text), "name": "alice", "key": "k"},
                               follow_redirects=False)
            assert done.status_code == 303 and done.headers["location"] == "/review/queue"
            assert "Flagged and escalated answers" in client.get("/review", follow_redirects=True).text
            assert client.get("/healthz").json() == {"status": "ok"}
            missing = client.post("/v1/chat/completions", json={"model": "m", "messages": []})
            assert missing.status_code == 400 and missing.json()["error"]  # the API is untouched
    finally:
        stop(process)
