"""Getting in and out of the review console over HTTP: login and logout only from the console's own forms."""

from __future__ import annotations

from tests.review.conftest import csrf_of

FOREIGN = "did not come from this console"


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
