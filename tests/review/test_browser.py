"""The review flow in a real browser: Debian's headless Chromium driven by Playwright, against
`morphguard review` started as its own process (default settings: Secure cookies, on loopback).

Log in, filter the queue, open an item, see its flagged claim marked with its reasons and evidence, take it and
label it with the keyboard, find the label in the export; an answer carrying <script> and <img onerror> stays
inert. The screenshots of the README are taken by `morphguard.review.screenshots`, run here into a scratch folder
(the suite leaves the work tree as it found it)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import httpx
import pytest
import yaml

from morphguard.config import AuditSettings
from morphguard.policy.audit import AuditStore
from morphguard.policy.record import DecisionRecord
from tests.forked import fork_command
from tests.review.conftest import seed
from tests.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# What the workplace's probe found Chromium needs here: no sandbox as root, and no calls home.
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]


@pytest.fixture
def review_process(tmp_path):
    if CHROMIUM is None:
        message = "Chromium is not installed (apt-get install -y chromium)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    audit_path = tmp_path / "audit.db"
    store = AuditStore(AuditSettings(path=str(audit_path)))
    ids = seed(store)
    store.close()
    port = free_port()
    config = {"policy": {"audit": {"path": str(audit_path)}},
              "review": {"port": port, "reviewers": {"alice": "browser-key"}}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    log = tmp_path / "review.log"
    process = fork_command(["review", "--config", str(tmp_path / "config.yaml")], log, ROOT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.get(base + "/login", timeout=1)
            break
        except httpx.HTTPError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(log.read_text()) from None
            time.sleep(0.1)
    yield base, ids
    process.terminate()
    process.wait(timeout=20)


def test_review_flow_in_chromium(review_process, tmp_path):
    from playwright.sync_api import sync_playwright

    base, ids = review_process
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        page = browser.new_page(viewport={"width": 1100, "height": 800})
        alerts: list[str] = []
        page.on("dialog", lambda dialog: (alerts.append(dialog.message), dialog.dismiss()))
        page.goto(base + "/")
        assert page.url.endswith("/login")
        page.fill("input[name=name]", "alice")
        page.fill("input[name=key]", "browser-key")
        page.click("button[type=submit]")
        page.wait_for_url(base + "/queue")
        assert page.locator("table.queue tbody tr").count() == 3  # the three flagged of four decisions

        page.select_option("select[name=topic]", "healthcare")
        page.click("form.filters button[type=submit]")
        page.wait_for_load_state()
        rows = page.locator("table.queue tbody tr")
        assert rows.count() == 2 and "legal" not in page.locator("table.queue").inner_text()
        assert "Yes, ibuprofen is safe throughout pregnancy." in page.locator("table.queue .claim").all_inner_texts()

        page.keyboard.press("j")
        page.keyboard.press("j")  # the second row: the flagged ibuprofen answer
        page.keyboard.press("Enter")
        page.wait_for_url(f"{base}/decisions/{ids['flagged']}")
        mark = page.locator("p.answer mark#c1")
        assert mark.inner_text().startswith("Yes, ibuprofen is safe throughout pregnancy.")
        assert page.locator("p.answer mark").count() == 1  # the flagged sentence, not the whole answer
        claim = page.locator("table.claims tr.claim")
        assert claim.count() == 1 and claim.locator(".why li").count() == 3
        assert claim.locator("mark.cited").inner_text() == \
            "Ibuprofen is contraindicated in the third trimester of pregnancy."

        page.keyboard.press("t")  # take the item
        page.locator("form.assign button", has_text="Give back").wait_for()
        assert "taken by\nalice" in page.locator("dl").inner_text()
        page.keyboard.press("h")
        page.fill("textarea[name=note]", "contradicts passage 1")
        page.keyboard.press("Control+Enter")
        page.wait_for_url("**saved=1")
        page.goto(f"{base}/decisions/{ids['flagged']}")
        assert "hallucinated" in page.locator("table.judgements").inner_text()

        page.goto(f"{base}/decisions/{ids['hostile']}")
        assert "<script>window.__pwned = 1</script>" in page.locator("p.answer").inner_text()
        assert page.evaluate("typeof window.__pwned") == "undefined" and alerts == []
        assert page.locator("p.answer img").count() == 0 and page.locator("p.answer script").count() == 0

        with page.expect_download() as download:
            page.evaluate(f"window.location.href = '{base}/export.jsonl'")
        exported = Path(download.value.path()).read_text()
        assert '"label": "hallucinated"' in exported and "contradicts passage 1" in exported
        browser.close()


def test_the_readme_screenshots_show_claims_with_evidence_and_reasons(tmp_path):
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (apt-get install -y chromium)")
    from morphguard.review.screenshots import NAMES, regenerate

    written = regenerate(tmp_path / "images")
    assert [p.name for p in written] == list(NAMES)
    for path in written:
        data = path.read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 20_000, path.name


def test_the_disagreement_view_lists_what_the_shadow_decided_otherwise(tmp_path):
    """The queue's "where the shadow disagrees" view, chosen in the filter form, lists exactly the answers the shadow
    candidate decided otherwise (live passes included), with its action beside the live one."""
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    from morphguard.config import ReviewSettings
    from morphguard.review.app import ReviewConsole
    from morphguard.review.screenshots import KEY, REVIEWER, example, serving

    store = AuditStore(AuditSettings(path=str(tmp_path / "audit.db")))
    example(store)
    store.record(DecisionRecord(request_id="passed", profile="general", topic="general", checked=True, score=0.4,
                                threshold=0.5, question="Is the museum open on Mondays?", answer="Yes, it is."))
    # live passed it (its texts hashed); the disagreement keeps them for review
    store.record_shadow("passed", "stricter", True, "annotate", {"request_id": "passed"},
                        {"question": "Is the museum open on Mondays?", "answer": "Yes, it is.", "context": "Closed."})
    console = ReviewConsole(ReviewSettings(secure_cookies=False), lambda: store, {REVIEWER: KEY},
                            topics=["healthcare", "legal"])
    try:
        with serving(console) as base, sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
            page = browser.new_page()
            page.goto(base + "/login")
            page.fill("input[name=name]", REVIEWER)
            page.fill("input[name=key]", KEY)
            page.click("button[type=submit]")
            page.wait_for_url(base + "/queue")
            assert page.locator("td.shadow").count() == 0
            page.select_option("select[name=shown]", "disagreed")
            page.click("form.filters button[type=submit]")
            page.wait_for_url("**shown=disagreed**")
            assert page.locator("h1").inner_text() == "Where the shadow candidate decided otherwise"
            rows = page.locator("table.queue tbody tr")
            assert rows.count() == 3
            assert sorted(page.locator("td.shadow").all_inner_texts()) == ["annotate", "block", "block"]
            assert "Is the museum open on Mondays?" in page.locator("table.queue").inner_text()
            browser.close()
    finally:
        store.close()
