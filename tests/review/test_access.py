"""Getting in and out of the review console over HTTP: login and logout only from the console's own forms, a
session ended by logging out ends in every process, and failed logins lock the guesser out."""

from __future__ import annotations

import base64
import json
import time

import httpx
import pytest
from itsdangerous import TimestampSigner

from morphguard.config import AuditSettings, ReviewSettings, StoreSettings
from morphguard.policy.audit import AuditStore
from morphguard.review.app import ReviewConsole
from morphguard.review.throttle import LoginThrottle
from tests.review.conftest import Console, csrf_of, serving

FOREIGN = "did not come from this console"
COOKIE = "morphguard_review"


def test_a_login_from_another_site_is_refused(console):
    # What a cross-site page can post: no cookie of the console, so no token, or a token of its own making.
    for token in ({}, {"csrf": ""}, {"csrf": "forged"}, {"csrf": "é"}):
        client = console.client()
        refused = client.post("/login", data={**token, "name": "alice", "key": console.key})
        assert refused.status_code == 403 and FOREIGN in refused.text
        assert client.get("/queue").status_code == 303  # not logged in
    # a browser that loaded the form but posts another page's token is refused too
    client = console.client()
    client.get("/login")
    other = csrf_of(console.client().get("/login").text)
    assert client.post("/login", data={"csrf": other, "name": "alice", "key": console.key}).status_code == 403


def test_a_logout_from_another_site_is_refused(console):
    client = console.login()
    for token in ({}, {"csrf": ""}, {"csrf": "forged"}):
        refused = client.post("/logout", data=token)
        assert refused.status_code == 403 and FOREIGN in refused.text
    assert client.get("/queue").status_code == 200  # still logged in
    assert console.client().post("/logout", data={}).status_code == 403  # no session: nothing to end


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_session_cookie_is_refused_after_logout_by_every_process(backend, tmp_path, request):
    # Two processes of one fleet: the same session secret, the same audit store, nothing else shared.
    settings = ReviewSettings(secure_cookies=False, session_secret="one secret for the fleet, 32 characters or more")
    url = request.getfixturevalue("postgres_url") if backend == "postgresql" else None
    stores = [AuditStore(AuditSettings(path=str(tmp_path / "audit.db")), StoreSettings(url=url)) for _ in range(2)]
    consoles = [ReviewConsole(settings, lambda store=store: store, {"alice": "k"}) for store in stores]
    try:
        with serving(consoles[0]) as first, serving(consoles[1]) as second:
            client = Console(first, stores[0], {}, key="k").login()
            cookie = client.cookies[COOKIE]
            other = httpx.Client(base_url=second, cookies={COOKIE: cookie}, timeout=10)
            assert other.get("/queue").status_code == 200  # the session holds in the other process
            logout = client.post("/logout", data={"csrf": csrf_of(client.get("/queue").text)})
            assert logout.status_code == 303
            for base in (first, second):  # the cookie as it was before logging out, replayed
                replayed = httpx.Client(base_url=base, cookies={COOKIE: cookie}, timeout=10)
                assert replayed.get("/queue").status_code == 303
                assert replayed.get("/export.jsonl").status_code == 303
            assert Console(second, stores[1], {}, key="k").login().get("/queue").status_code == 200  # a new one
    finally:
        for store in stores:
            store.close()


def test_a_session_is_refused_past_its_end_however_recently_used(tmp_path):
    secret = "one secret for the fleet, 32 characters or more"
    store = AuditStore(AuditSettings(path=str(tmp_path / "audit.db")))

    def cookie(expires: float) -> str:  # a session cookie as the console signs it (Starlette's SessionMiddleware)
        session = {"reviewer": "alice", "csrf": "t", "sid": "s", "expires": int(expires)}
        return TimestampSigner(secret).sign(base64.b64encode(json.dumps(session).encode())).decode()

    try:
        with serving(ReviewConsole(ReviewSettings(secure_cookies=False, session_secret=secret), lambda: store,
                                   {"alice": "k"})) as base:
            alive = httpx.Client(base_url=base, cookies={COOKIE: cookie(time.time() + 60)}, timeout=10)
            assert alive.get("/queue").status_code == 200
            ended = httpx.Client(base_url=base, cookies={COOKIE: cookie(time.time() - 1)}, timeout=10)
            assert ended.get("/queue").status_code == 303
    finally:
        store.close()


def login_from(console: Console, address: str, key: str) -> httpx.Response:
    """A login as if from `address` (uvicorn takes X-Forwarded-For from the loopback proxy the tests are)."""
    client = console.client()
    client.headers["x-forwarded-for"] = address
    csrf = csrf_of(client.get("/login").text)
    return client.post("/login", data={"csrf": csrf, "name": "alice", "key": key})


def test_failed_logins_lock_their_address_out_even_with_the_right_key(console):
    for _ in range(ReviewSettings().login_failures):
        assert login_from(console, "10.0.0.1", "guess").status_code == 401
    locked = login_from(console, "10.0.0.1", console.key)
    assert locked.status_code == 429 and int(locked.headers["retry-after"]) > 0
    assert "Too many failed logins" in locked.text
    assert login_from(console, "10.0.0.2", console.key).status_code == 303  # only that address


def test_failed_logins_from_many_addresses_lock_every_address_out(console):
    for n in range(ReviewSettings().login_failures_overall):  # one each: no address reaches its own limit
        assert login_from(console, f"10.0.{n // 200}.{n % 200}", "guess").status_code == 401
    locked = login_from(console, "10.1.0.1", console.key)
    assert locked.status_code == 429 and int(locked.headers["retry-after"]) > 0


def test_each_further_lockout_is_twice_as_long_until_the_address_stays_quiet():
    settings = ReviewSettings(login_lockout_s=30, login_lockout_max_s=100)
    now = [1000.0]
    throttle = LoginThrottle(settings, clock=lambda: now[0])

    def lockout_after_failures() -> float:
        for _ in range(settings.login_failures):
            throttle.failed("10.0.0.1")
        wait = throttle.retry_after("10.0.0.1")
        now[0] += wait
        return wait

    assert [lockout_after_failures() for _ in range(4)] == [30, 60, 100, 100]
    assert throttle.retry_after("10.0.0.1") == 0
    now[0] += settings.login_window_s + 1  # a window without failures after the last lockout: forgotten
    assert lockout_after_failures() == 30
