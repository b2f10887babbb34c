"""The escalation outbox: what a replica delivered is marked delivered, also when the store was down meanwhile."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import sqlalchemy as sa

from morphguard.config import AuditSettings, EscalationSettings
from morphguard.policy.audit import AuditStore
from morphguard.policy.record import DecisionRecord
from morphguard.proxy.escalation import Escalator
from tests.servers import bound_socket


class Webhook:
    """A webhook on loopback that counts what arrives and answers 200."""

    def __init__(self) -> None:
        self.posts = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", 0)))
                outer.posts += 1
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        sock = bound_socket()
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}/hook"
        self.server = ThreadingHTTPServer(sock.getsockname(), Handler, bind_and_activate=False)
        self.server.socket.close()
        self.server.socket = sock
        self.server.server_activate()
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_an_escalation_delivered_while_the_store_is_down_is_marked_once_the_store_is_back(tmp_path, monkeypatch):
    webhook = Webhook()
    store = AuditStore(AuditSettings(path=str(tmp_path / "audit.db")))
    settings = EscalationSettings(webhook_url=webhook.url, timeout_s=1, claim_timeout_s=10)
    down = [sa.exc.OperationalError("UPDATE escalations", {}, sqlite3.OperationalError("database is locked"))
            for _ in range(2)]
    write = store.escalation_outcome

    def while_down(*args: object, **kwargs: object) -> None:
        if down:
            raise down.pop()
        write(*args, **kwargs)

    monkeypatch.setattr(store, "escalation_outcome", while_down)

    async def escalate() -> None:
        escalator = Escalator(settings, store)
        record = DecisionRecord(request_id="r1", profile="general", topic="general", checked=True, score=0.9,
                                flagged=True, escalated=True)
        (written,) = store.record_many([record], owner=escalator.owner)
        escalator.submit(record.escalation(), written.outbox_id)
        await escalator.aclose(grace_s=30)

    asyncio.run(escalate())
    webhook.server.shutdown()
    assert webhook.posts == 1 and not down
    assert store.escalation_states() == {"delivered": 1}
    assert store.claim_escalations("another-replica", stale_s=0.0) == []  # nothing left for a sweep to send again
    store.close()
