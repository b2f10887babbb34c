"""The review console under uvicorn on a real socket, over an audit store seeded with decisions."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import uvicorn

from morphguard.config import AuditSettings, ReviewSettings
from morphguard.policy.audit import AuditStore
from morphguard.policy.record import DecisionRecord, EvidenceRecord, FactoidRecord
from morphguard.review.app import ReviewConsole
from tests.servers import bound_socket

PASSAGES = ["Ibuprofen is contraindicated in the third trimester of pregnancy. It can harm the baby's heart.",
            "Paracetamol is the first choice for pain relief during pregnancy."]
HOSTILE = 'Fine. <script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2"> Really.'


def seed(store: AuditStore) -> dict[str, int]:
    """Decisions of each kind; returns name → request id's row id."""
    def record(request_id: str, **fields: object) -> int:
        base = {"request_id": request_id, "profile": "general", "topic": "healthcare", "checked": True,
                "detector": "metarag", "question": "Can pregnant women take ibuprofen?",
                "context": "\n\n".join(PASSAGES), "trace_id": "0af7651916cd43dd8448eb211c80319c"}
        return store.record(DecisionRecord(**{**base, **fields}))

    answer = "Yes, ibuprofen is safe throughout pregnancy. Paracetamol is the first choice."
    # as the combined check records them: three of its parts name the first sentence, one its phrase
    factoids = [FactoidRecord(text="Yes, ibuprofen is safe throughout pregnancy.", start=0, end=44, score=0.9,
                              flagged=True, label="contradicted",
                              reason="copies a context sentence but changes it (negation)",
                              evidence=[EvidenceRecord(passage=1, start=0, end=65)]),
                FactoidRecord(text="safe throughout pregnancy", start=18, end=43, score=0.9, flagged=True,
                              label="unsupported", reason="the judge names it as not supported by the passages"),
                FactoidRecord(text="Yes, ibuprofen is safe throughout pregnancy.", start=0, end=44, score=0.85,
                              flagged=True, label="unsupported",
                              reason="the judge finds it stated nowhere in the context"),
                FactoidRecord(text="Paracetamol is the first choice.", start=45, end=77, score=0.1, flagged=False,
                              label="supported")]
    ids = {
        "flagged": record("req-flagged", score=0.9, threshold=0.3, flagged=True, action="annotate", answer=answer,
                          factoids=factoids, cost={"calls": 6, "input_tokens": 1300, "output_tokens": 190}),
        "hostile": record("req-hostile", score=0.8, threshold=0.3, flagged=True, action="block", answer=HOSTILE,
                          escalated=True),
        "faithful": record("req-faithful", score=0.1, threshold=0.3, flagged=False, answer="Paracetamol."),
        "legal": record("req-legal", topic="legal", score=0.6, threshold=0.5, flagged=True, action="annotate",
                        answer="The court always decides in a week."),
    }
    store.add_escalation("req-hostile", {"request_id": "req-hostile"}, owner="test")
    return ids


@dataclass
class Console:
    base: str
    store: AuditStore
    ids: dict[str, int]
    key: str = "s3cret-key"

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.base, follow_redirects=False, timeout=10)

    def login(self, client: httpx.Client | None = None) -> httpx.Client:
        client = client or self.client()
        csrf = csrf_of(client.get("/login").text)
        response = client.post("/login", data={"csrf": csrf, "name": "alice", "key": self.key})
        assert response.status_code == 303, response.text
        return client


def csrf_of(html: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', html)
    assert match, html
    return match.group(1)


@contextmanager
def serving(console: ReviewConsole) -> Iterator[str]:
    """The console on a port of its own while the block runs; yields its base URL."""
    sock = bound_socket()
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(console.app(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture
def console(tmp_path: Path) -> Iterator[Console]:
    store = AuditStore(AuditSettings(path=str(tmp_path / "audit.db"), store_text="hash", keep_text="flagged"))
    ids = seed(store)
    settings = ReviewSettings(secure_cookies=False, page_size=2,
                              trace_url="http://phoenix.local/projects/default/traces/{trace_id}")
    app = ReviewConsole(settings, lambda: store, {"alice": "s3cret-key", "bob": "other-key"},
                        topics=["healthcare", "legal"])
    try:
        with serving(app) as base:
            yield Console(base, store, ids)
    finally:
        store.close()
