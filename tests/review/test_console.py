"""Every route of the review console over HTTP: who may see what, CSRF on every form, escaping, the
queue's filters and pages, judgements stored as their own records, export, insights, retention."""

from __future__ import annotations

import json
import re

import httpx
import sqlalchemy as sa

from morphguard.config import AuditSettings, ReviewSettings, StoreSettings
from morphguard.policy.audit import AuditStore, decisions
from morphguard.policy.record import DecisionRecord
from morphguard.review.app import ReviewConsole
from tests.review.conftest import Console, csrf_of, serving


def test_nothing_is_shown_before_logging_in(console):
    client = console.client()
    for path in ("/queue", f"/decisions/{console.ids['flagged']}", "/insights", "/export.jsonl"):
        response = client.get(path)
        assert response.status_code == 303 and response.headers["location"].endswith("/login")
    response = client.post(f"/decisions/{console.ids['flagged']}/review", data={"label": "faithful"})
    assert response.status_code == 403
    assert console.store.engine.connect().execute(sa.text("SELECT count(*) FROM reviews")).scalar() == 0


def test_login_needs_the_form_token_and_the_right_key(console):
    client = console.client()
    page = client.get("/login")
    assert page.headers["x-frame-options"] == "DENY" and "script-src 'self'" in page.headers["content-security-policy"]
    csrf = csrf_of(page.text)
    assert client.post("/login", data={"name": "alice", "key": "s3cret-key"}).status_code == 403  # no token
    wrong = client.post("/login", data={"csrf": csrf, "name": "alice", "key": "other-key"})  # bob's key
    assert wrong.status_code == 401 and "wrong key" in wrong.text
    assert client.post("/login", data={"csrf": csrf, "name": "mallory", "key": "s3cret-key"}).status_code == 401
    ok = client.post("/login", data={"csrf": csrf, "name": "alice", "key": "s3cret-key"})
    assert ok.status_code == 303
    cookie = ok.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie
    assert client.get("/queue").status_code == 200


def test_the_queue_holds_flagged_and_escalated_answers_with_filters_and_pages(console):
    client = console.login()
    first = client.get("/queue")  # page size 2, newest first
    assert first.status_code == 200
    seen = [int(i) for i in re.findall(r'data-href="/decisions/(\d+)"', first.text)]
    assert seen == [console.ids["legal"], console.ids["hostile"]]
    nxt = re.search(r'href="(\?[^"]+)" rel="next"', first.text).group(1).replace("&amp;", "&")
    second = client.get("/queue" + nxt)
    seen += [int(i) for i in re.findall(r'data-href="/decisions/(\d+)"', second.text)]
    assert seen == [console.ids["legal"], console.ids["hostile"], console.ids["flagged"]]  # not the unflagged one
    assert 'rel="next"' not in second.text
    legal = client.get("/queue", params={"topic": "legal"}).text
    assert f"/decisions/{console.ids['legal']}" in legal and f"/decisions/{console.ids['flagged']}" not in legal
    blocked = client.get("/queue", params={"action": "block"}).text
    assert f"/decisions/{console.ids['hostile']}" in blocked and f"/decisions/{console.ids['legal']}" not in blocked
    by_score = client.get("/queue", params={"order": "score"}).text
    order = [int(i) for i in re.findall(r'data-href="/decisions/(\d+)"', by_score)]
    assert order == [console.ids["flagged"], console.ids["hostile"]]  # 0.9, then 0.8
    assert client.get("/queue", params={"since": "not a time", "after": "1:x"}).status_code == 200  # ignored, not 500


def test_the_detail_page_marks_flagged_spans_and_their_evidence(console):
    client = console.login()
    page = client.get(f"/decisions/{console.ids['flagged']}").text
    # the flagged sentence is marked, not the whole answer; the unflagged one is plain text
    assert ('<mark id="c1" class="contradicted" title="claim 1: contradicted, score 0.90">Yes, ibuprofen is safe '
            'throughout pregnancy.<sup>1</sup></mark> Paracetamol is the first choice.</p>') in page
    # three detector parts named that sentence: one row, with each part's reason and the sentence it contradicts
    rows = re.findall(r'<tr id="claim-(\d+)" class="claim ([a-z]*)">(.*?)</tr>', page, re.S)
    assert [(n, label) for n, label, _ in rows] == [("1", "contradicted")]
    cells = rows[0][2]
    assert cells.count("<li>") == 3 and "changes it (negation)" in cells and "stated nowhere in the context" in cells
    assert ('<mark class="cited" title="the sentence the check compared for claim 1">Ibuprofen is contraindicated in '
            'the third trimester of pregnancy.</mark>') in cells
    assert 'name="f1"' in cells  # a reviewer's label for the claim is kept under its first factoid's number
    assert "Other statements checked (1)" in page
    assert 'href="http://phoenix.local/projects/default/traces/0af7651916cd43dd8448eb211c80319c"' in page
    assert "6 judge calls" in page and "general / healthcare" in page


def test_answers_and_passages_are_text_never_markup(console):
    client = console.login()
    page = client.get(f"/decisions/{console.ids['hostile']}").text
    assert "<script>window" not in page and "<img src=x" not in page
    assert "yes, pending" in page  # escalated, the webhook has not taken it yet
    assert "&lt;script&gt;window.__pwned = 1&lt;/script&gt;&lt;img src=x onerror=" in page


def test_a_judgement_needs_the_token_and_is_its_own_record(console):
    client = console.login()
    target = console.ids["flagged"]
    page = client.get(f"/decisions/{target}").text
    csrf = csrf_of(page)
    assert client.post(f"/decisions/{target}/review", data={"label": "hallucinated"}).status_code == 403
    forged = client.post(f"/decisions/{target}/review", data={"label": "hallucinated", "csrf": "forged"})
    assert forged.status_code == 403
    assert client.post(f"/decisions/{target}/review", data={"label": "maybe", "csrf": csrf}).status_code == 400
    assert client.post("/decisions/999/review", data={"label": "faithful", "csrf": csrf}).status_code == 404
    before = dict(console.store.engine.connect().execute(
        sa.select(decisions).where(decisions.c.id == target)).mappings().one())
    saved = client.post(f"/decisions/{target}/review",
                        data={"label": "hallucinated", "f1": "hallucinated", "f2": "faithful", "note": "<b>no</b>",
                              "csrf": csrf})
    assert saved.status_code == 303 and "saved=1" in saved.headers["location"]
    after = dict(console.store.engine.connect().execute(
        sa.select(decisions).where(decisions.c.id == target)).mappings().one())
    assert after == before  # the decision is never rewritten
    page = client.get(f"/decisions/{target}").text
    assert "alice" in page and "#1 hallucinated, #2 faithful" in page and "&lt;b&gt;no&lt;/b&gt;" in page
    reviewed = client.get("/queue", params={"reviewed": "yes"}).text
    assert f"/decisions/{target}" in reviewed and "to review" not in reviewed
    assert f"/decisions/{target}\"" not in client.get("/queue", params={"reviewed": "no"}).text


def test_export_has_every_judgement_and_no_text(console):
    client = console.login()
    target = console.ids["legal"]
    csrf = csrf_of(client.get(f"/decisions/{target}").text)
    client.post(f"/decisions/{target}/review", data={"label": "faithful", "note": "fine", "csrf": csrf})
    lines = client.get("/export.jsonl").text.splitlines()
    (row,) = [json.loads(line) for line in lines]
    assert row["label"] == "faithful" and row["reviewer"] == "alice" and row["request_id"] == "req-legal"
    assert "answer" not in row and "question" not in row
    csv_text = client.get("/export.csv")
    assert csv_text.headers["content-disposition"].startswith("attachment") and "req-legal" in csv_text.text
    assert client.get("/export.xml").status_code == 404


def test_insights_draw_the_topics(console):
    client = console.login()
    csrf = csrf_of(client.get(f"/decisions/{console.ids['flagged']}").text)
    client.post(f"/decisions/{console.ids['flagged']}/review", data={"label": "hallucinated", "csrf": csrf})
    client.post(f"/decisions/{console.ids['hostile']}/review", data={"label": "faithful", "csrf": csrf})
    page = client.get("/insights").text
    assert page.count("<svg") == 3 and "healthcare" in page and "legal" in page
    assert "50%" in page  # healthcare: one flag confirmed, one dismissed


def test_logout_needs_the_token_and_ends_the_session(console):
    client = console.login()
    assert client.post("/logout", data={}).status_code == 403
    csrf = csrf_of(client.get("/queue").text)
    assert client.post("/logout", data={"csrf": csrf}).status_code == 303
    assert client.get("/queue").status_code == 303


def test_unknown_pages_are_plain_404s(console):
    client = console.login()
    assert client.get("/nowhere").status_code == 404
    assert client.get("/decisions/424242").status_code == 404
    assert client.get("/decisions/abc").status_code == 404


def assert_no_decision_pages(client: httpx.Client) -> None:
    """Paths no decision can have, shown and judged: the console's 404 page."""
    csrf = csrf_of(client.get("/queue").text)
    for wrong in ("9" * 40, "9" * 5000, str(2**63), str(2**31), "-1", "1.5", "0x10", "abc", "%C3%A9", "%C2%B2"):
        page = client.get(f"/decisions/{wrong}")
        assert page.status_code == 404 and page.headers["content-type"].startswith("text/html")
        assert "<h1>No such decision.</h1>" in page.text
        judged = client.post(f"/decisions/{wrong}/review", data={"label": "faithful", "csrf": csrf})
        assert judged.status_code == 404 and "<h1>No such decision.</h1>" in judged.text


def test_a_path_no_decision_can_have_is_a_404_page(console):
    assert_no_decision_pages(console.login())


def test_a_path_no_decision_can_have_is_a_404_page_on_postgresql(postgres_url, tmp_path):
    # PostgreSQL refuses a number past its 32-bit INTEGER where SQLite would look it up
    store = AuditStore(AuditSettings(path=str(tmp_path / "unused.db")), StoreSettings(url=postgres_url))
    try:
        with serving(ReviewConsole(ReviewSettings(secure_cookies=False), lambda: store, {"alice": "k"})) as base:
            assert_no_decision_pages(Console(base, store, {}, key="k").login())
    finally:
        store.close()


def test_an_unexpected_error_is_a_page_of_the_console_without_details():
    # Mounted in `serve`, the console answers before the proxy's audit store exists: a request then fails.
    settings = ReviewSettings(secure_cookies=False)
    with serving(ReviewConsole(settings, lambda: None, {"alice": "k"})) as base:
        client = httpx.Client(base_url=base, timeout=10)
        login = client.post("/login", data={"csrf": csrf_of(client.get("/login").text), "name": "alice", "key": "k"})
        assert login.status_code == 303
        page = client.get("/queue")
    assert page.status_code == 500 and page.headers["content-type"].startswith("text/html")
    assert "<h1>Something went wrong" in page.text and "RuntimeError" not in page.text
    assert page.headers["x-frame-options"] == "DENY"


def test_text_is_kept_for_flagged_answers_only_and_purged_after_its_days(console):
    store = console.store
    client = console.login()
    unflagged = client.get(f"/decisions/{console.ids['faithful']}").text
    assert "was not kept" in unflagged and "Paracetamol.</p>" not in unflagged
    row = client.get(f"/decisions/{console.ids['flagged']}").text
    assert "was not kept" not in row
    # a flagged answer from long ago: its text is past its days and purged to the hash
    old = store.record(DecisionRecord(request_id="old", profile="general", topic="healthcare", checked=True,
                                      flagged=True, score=0.7, answer="old text", question="q"))
    with store.engine.begin() as db:
        db.execute(decisions.update().where(decisions.c.id == old).values(text_kept_until="2000-01-01T00:00:00"))
    assert store.purge_text() == 1
    purged = client.get(f"/decisions/{old}").text
    assert "was not kept" in purged and "old text" not in purged
    assert store.purge_text() == 0


def test_the_detail_page_looks_up_the_evidence_of_the_first_flagged_claims_only():
    """Each claim's evidence is looked up over the whole context; an answer can carry thousands of flagged ones."""
    from morphguard.review.pages import MAX_MARKED, attach_evidence, claims_of, passage_pieces

    passages = [" ".join(f"Kettle {i} is safe for adults." for i in range(200))]
    factoids = [{"text": f"Kettle {i} is cheap in Paris.", "flagged": True, "score": 0.9} for i in range(200)]
    claims = claims_of("", factoids, flagged_answer=True)
    attach_evidence(claims, passages)
    (pieces,) = passage_pieces(passages, claims)
    marked = [p for p in pieces if p.claim is not None]
    assert [p.claim for p in marked] == list(range(1, MAX_MARKED + 1))
    assert marked[2].text == "Kettle 2 is safe for adults."


def test_claims_merge_the_parts_that_name_one_stretch_of_the_answer():
    from morphguard.review.pages import claims_of

    answer = "Ibuprofen is safe. It costs 4 euros. Take it daily."
    factoids = [{"text": "Ibuprofen is safe.", "start": 0, "end": 18, "score": 0.4, "flagged": False,
                 "label": "contradicted", "reason": "changed copy"},
                {"text": "safe", "start": 13, "end": 17, "score": 0.9, "flagged": True, "label": "unsupported",
                 "reason": "judge"},
                {"text": "It costs 4 euros.", "start": 19, "end": 36, "score": 0.2, "flagged": False},
                {"text": "somewhere unplaced", "score": 0.8, "flagged": True},
                {"text": "somewhere unplaced", "score": 0.7, "flagged": True}]
    claims = claims_of(answer, factoids, flagged_answer=True)
    assert [(c.text, c.flagged, c.label, c.score, c.reasons) for c in claims] == [
        ("Ibuprofen is safe.", True, "contradicted", 0.9, ["changed copy", "judge"]),
        ("It costs 4 euros.", False, None, 0.2, []),
        ("somewhere unplaced", True, None, 0.8, [])]
    # a contradicted claim of an answer that is not flagged is not flagged either
    assert not claims_of(answer, factoids[:1], flagged_answer=False)[0].flagged
