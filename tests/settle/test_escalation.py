"""The escalation outbox: what a replica delivered is marked delivered, also when the store was down meanwhile."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import sqlalchemy as sa

from morphguard.config import AuditSettings, EscalationSettings
from morphguard.policy.audit import AuditStore
from morphguard.policy.record import DecisionRecord
from morphguard.settle.escalation import Escalator
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
    down = [locked() for _ in range(2)]
    write = store.escalation_outcome

    def twice_locked(*args: object, **kwargs: object) -> None:
        if down:
            raise down.pop()
        write(*args, **kwargs)

    monkeypatch.setattr(store, "escalation_outcome", twice_locked)

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


@pytest.mark.slow  # an outage of 8 s
def test_after_an_outage_longer_than_a_claim_the_owner_marks_its_delivery_and_no_replica_sends_it_again(tmp_path,
                                                                                                        monkeypatch):
    """The store goes down just after the webhook took the escalation and stays down past the claim's timeout: the
    claim is stale when the store is back, yet the owner's mark lands first and the other replica, sweeping all the
    while, takes nothing over."""
    outage_s = 8.0  # past the claim's timeout and the last wait before another try of the outcome (a third of it)
    down_until = [0.0]
    webhook = Webhook()
    handler = webhook.server.RequestHandlerClass
    first_post = handler.do_POST

    def post_then_outage(self: BaseHTTPRequestHandler) -> None:
        first_post(self)
        if not down_until[0]:
            down_until[0] = time.monotonic() + outage_s

    monkeypatch.setattr(handler, "do_POST", post_then_outage)
    settings = EscalationSettings(webhook_url=webhook.url, timeout_s=0.1, claim_timeout_s=5.2)
    owner_store, other_store = (AuditStore(AuditSettings(path=str(tmp_path / "audit.db"))) for _ in range(2))
    for store in (owner_store, other_store):
        for name in ("escalation_outcome", "renew_claim", "claim_escalations", "reachable"):
            monkeypatch.setattr(store, name, while_down(getattr(store, name), down_until))

    async def escalate() -> None:
        owner, other = Escalator(settings, owner_store), Escalator(settings, other_store)
        await other.resume()  # it sweeps every claim_timeout_s / 3 from now on
        record = DecisionRecord(request_id="r1", profile="general", topic="general", checked=True, score=0.9,
                                flagged=True, escalated=True)
        (written,) = owner_store.record_many([record], owner=owner.owner)
        owner.submit(record.escalation(), written.outbox_id)
        # until past the other's first sweep after the store's return (its sweeps are claim_timeout_s / 3 apart)
        while not down_until[0] or time.monotonic() < down_until[0] + 2.5:
            await asyncio.sleep(0.1)
        await owner.aclose(grace_s=5)
        await other.aclose(grace_s=5)

    asyncio.run(escalate())
    webhook.server.shutdown()
    assert webhook.posts == 1
    assert owner_store.escalation_states() == {"delivered": 1}
    for store in (owner_store, other_store):
        store.close()


def while_down(method, down_until: list[float]):
    """`method`, failing as SQLite does when another holds its lock, until `down_until[0]` (0: not yet down)."""
    def call(*args: object, **kwargs: object) -> object:
        if down_until[0] and time.monotonic() < down_until[0]:
            if method.__name__ == "reachable":
                return False
            raise locked()
        return method(*args, **kwargs)

    return call


def locked() -> sa.exc.OperationalError:
    """What SQLAlchemy raises when SQLite's lock is held elsewhere: the store unavailable for now."""
    return sa.exc.OperationalError("UPDATE escalations", {}, sqlite3.OperationalError("database is locked"))
