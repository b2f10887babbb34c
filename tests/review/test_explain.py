"""What the console tells a reviewer without opening an item, finding items by their text, taking an item so
that two reviewers do not judge it at once, and charts over a single day of judgements: over HTTP, against the
console under uvicorn, on SQLite and on PostgreSQL."""

from __future__ import annotations

import html
import re

import httpx
import pytest

from morphguard.config import AuditSettings, ReviewSettings, StoreSettings
from morphguard.policy.audit import AuditStore
from morphguard.policy.reviews import ReviewStore
from morphguard.review.app import ReviewConsole
from tests.review.conftest import Console, csrf_of, seed, serving


@pytest.fixture(params=["sqlite", "postgresql"])
def any_store_console(request, tmp_path):
    url = None if request.param == "sqlite" else request.getfixturevalue("postgres_url")
    store = AuditStore(AuditSettings(path=str(tmp_path / "audit.db"), store_text="hash", keep_text="flagged"),
                       StoreSettings(url=url))
    ids = seed(store)
    app = ReviewConsole(ReviewSettings(secure_cookies=False), lambda: store,
                        {"alice": "s3cret-key", "bob": "other-key"}, topics=["healthcare", "legal"])
    try:
        with serving(app) as base:
            yield Console(base, store, ids)
    finally:
        store.close()


def listed(page: str) -> list[int]:
    return [int(i) for i in re.findall(r'data-href="/decisions/(\d+)"', page)]


def test_queue_rows_show_the_question_and_the_flagged_claim(console):
    page = html.unescape(console.login().get("/queue", params={"topic": "healthcare"}).text)
    row = re.search(rf'<tr data-href="/decisions/{console.ids["flagged"]}">(.*?)</tr>', page, re.S).group(1)
    assert "Can pregnant women take ibuprofen?" in row
    assert '<span class="claim">Yes, ibuprofen is safe throughout pregnancy.</span>' in row


def test_search_finds_words_of_the_question_or_the_answer(any_store_console):
    console = any_store_console
    client = console.login()
    assert listed(client.get("/queue", params={"q": "COURT always"}).text) == [console.ids["legal"]]  # answer
    assert listed(client.get("/queue", params={"q": "safe throughout"}).text) == [console.ids["flagged"]]
    by_question = listed(client.get("/queue", params={"q": "pregnant women"}).text)  # every seeded question
    assert by_question == [console.ids["legal"], console.ids["hostile"], console.ids["flagged"]]
    assert listed(client.get("/queue", params={"q": "100%_"}).text) == []  # LIKE's wildcards are plain text
    assert 'value="pregnant women"' in client.get("/queue", params={"q": "pregnant women"}).text


def _alice_and_bob(console: Console) -> tuple[httpx.Client, httpx.Client]:
    """Two reviewers logged in to the console."""
    alice = console.login()
    bob = console.client()
    bob.post("/login", data={"csrf": csrf_of(bob.get("/login").text), "name": "bob", "key": "other-key"})
    return alice, bob


def test_a_reviewer_takes_an_item_and_another_cannot(any_store_console):
    console = any_store_console
    item = console.ids["flagged"]
    alice, bob = _alice_and_bob(console)
    token = csrf_of(alice.get(f"/decisions/{item}").text)
    assert alice.post(f"/decisions/{item}/take", data={}).status_code == 403  # no token
    assert alice.post(f"/decisions/{item}/take", data={"csrf": token}).status_code == 303
    page = alice.get(f"/decisions/{item}").text
    assert "<dt>taken by</dt><dd>alice</dd>" in page and "Give back" in page
    bob_token = csrf_of(bob.get(f"/decisions/{item}").text)
    refused = bob.post(f"/decisions/{item}/take", data={"csrf": bob_token})
    assert refused.status_code == 409 and "alice has taken this item already" in refused.text
    assert listed(alice.get("/queue", params={"assigned": "me"}).text) == [item]
    assert listed(bob.get("/queue", params={"assigned": "me"}).text) == []
    assert item not in listed(bob.get("/queue", params={"assigned": "nobody"}).text)
    bob.post(f"/decisions/{item}/release", data={"csrf": bob_token})  # not bob's to give back
    assert "<dd>alice</dd>" in alice.get(f"/decisions/{item}").text
    alice.post(f"/decisions/{item}/release", data={"csrf": token})
    assert bob.post(f"/decisions/{item}/take", data={"csrf": bob_token}).status_code == 303
    assert listed(bob.get("/queue", params={"assigned": "me"}).text) == [item]
    assert alice.post("/decisions/999999/take", data={"csrf": token}).status_code == 404


def test_a_reviewer_cannot_judge_an_item_another_has_taken(any_store_console):
    console = any_store_console
    item = console.ids["flagged"]
    alice, bob = _alice_and_bob(console)
    token, bob_token = csrf_of(alice.get(f"/decisions/{item}").text), csrf_of(bob.get(f"/decisions/{item}").text)
    assert alice.post(f"/decisions/{item}/take", data={"csrf": token}).status_code == 303
    refused = bob.post(f"/decisions/{item}/review", data={"label": "faithful", "csrf": bob_token})
    assert refused.status_code == 409 and "alice has taken this item" in html.unescape(refused.text)
    assert ReviewStore(console.store).judgements(item) == []
    assert alice.post(f"/decisions/{item}/review", data={"label": "hallucinated", "csrf": token}).status_code == 303
    alice.post(f"/decisions/{item}/release", data={"csrf": token})
    assert bob.post(f"/decisions/{item}/review", data={"label": "faithful", "csrf": bob_token}).status_code == 303
    assert [j["reviewer"] for j in ReviewStore(console.store).judgements(item)] == ["bob", "alice"]


def test_charts_draw_a_single_day_and_keep_their_legend_inside(console):
    client = console.login()
    csrf = csrf_of(client.get(f"/decisions/{console.ids['flagged']}").text)
    for name, label in (("flagged", "hallucinated"), ("legal", "faithful"), ("hostile", "hallucinated")):
        client.post(f"/decisions/{console.ids[name]}/review", data={"label": label, "csrf": csrf})
    page = client.get("/insights").text
    precision = page[page.index("Reviewers&#39; precision of flags"):]
    precision = precision[:precision.index("</svg>")]
    assert "No data yet" not in precision
    assert len(re.findall(r"<circle ", precision)) == 2  # one day, two topics: a point each
    for svg in re.findall(r"<svg.*?</svg>", page, re.S):
        assert_legend_inside(svg)


def assert_legend_inside(svg: str) -> None:
    width, height = map(float, re.search(r'viewBox="0 0 ([\d.]+) ([\d.]+)"', svg).groups())
    legend = svg[svg.index('<g class="legend">'):]
    for x, y, label in re.findall(r'<text x="([\d.]+)" y="([\d.]+)">([^<]*)</text>', legend):
        assert float(x) + 6.5 * len(label) <= width and float(y) <= height, label


def test_a_legend_of_many_topics_wraps_inside_the_chart():
    from jinja2 import Environment, FileSystemLoader

    from morphguard.review import charts
    from morphguard.review.app import HERE

    topics = ["healthcare", "employment law", "immigration and visas", "consumer finance", "tax", "pharmacology"]
    scores = [(t, "2026-11-20", 0.8, "hallucinated" if i % 2 else "faithful") for i, t in enumerate(topics)]
    chart = charts.precision_over_time(scores)
    page = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=True).get_template(
        "insights.html").render(base="", summary=[], charts=[chart], reviewer="a", csrf="")
    (svg,) = re.findall(r"<svg.*?</svg>", page, re.S)
    assert_legend_inside(svg)
    assert len({k.y for k in chart.legend}) > 1  # more than one row
