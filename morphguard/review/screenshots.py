"""The console's screenshots for the docs: an example audit store, the console over it on a loopback port, and
headless Chromium (Playwright) taking the queue, a decision's claims and the insights.

    python -m morphguard.review.screenshots [docs/images]

Needs Chromium (`chromium` on the PATH, or CHROMIUM=path) and the `playwright` package (the test extra).
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import uvicorn

from morphguard.config import Action, AuditSettings, ReviewSettings
from morphguard.policy.audit import AuditStore
from morphguard.policy.comparison import Outcome
from morphguard.policy.record import DecisionRecord, EvidenceRecord, FactoidRecord
from morphguard.policy.reviews import ReviewStore
from morphguard.review.app import ReviewConsole

# Chromium as root in a container: no sandbox, and no calls home.
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]
NAMES = ("review-queue.png", "review-detail.png", "review-insights.png", "review-disagreements.png")
REVIEWER, KEY = "alice", "screenshot-key"

_LEAFLET = ["Ibuprofen is contraindicated in the third trimester of pregnancy. It can harm the baby's heart and "
            "kidneys and reduce the amniotic fluid.",
            "Paracetamol is the first choice for pain relief during pregnancy. The usual adult dose is 500 mg to 1 g "
            "every 4 to 6 hours, up to 4 g in 24 hours.",
            "Ask a pharmacist before taking any painkiller while breastfeeding."]
_CONTRACT = ["The notice period is three months for employees with more than five years of service.",
             "Either party may end the contract during the probation period with two weeks' notice."]


def example(store: AuditStore, day: datetime | None = None) -> int:
    """Decisions of one day as a guarded assistant leaves them, a few judged; returns the id of the one the
    detail screenshot shows."""
    day = day or datetime.now(UTC).replace(hour=9, minute=0, second=0, microsecond=0)

    def record(n: int, topic: str, question: str, context: list[str], answer: str, score: float,
               factoids: list[FactoidRecord], action: Action = "annotate", escalated: bool = False) -> int:
        written = store.record(DecisionRecord(
            time=(day + timedelta(minutes=37 * n)).isoformat(timespec="milliseconds"), request_id=f"example-{n}",
            trace_id=f"{n:032x}", profile="clinical" if topic == "healthcare" else "general", topic=topic,
            checked=True, detector="combined", score=score, threshold=0.5, flagged=score >= 0.5, action=action,
            escalated=escalated, question=question, answer=answer, context="\n\n".join(context), factoids=factoids,
            latency_ms=420 + 40 * n, cost={"calls": 3, "input_tokens": 1840, "output_tokens": 96}))
        assert written is not None  # a fresh store: every request id is new
        return written

    def claim(answer: str, text: str, score: float, label: str, reason: str,
              evidence: tuple[int, str, list[str]] | None = None) -> FactoidRecord:
        start = answer.index(text)
        places = []
        if evidence is not None:
            passage, sentence, passages = evidence
            at = passages[passage - 1].index(sentence)
            places = [EvidenceRecord(passage=passage, start=at, end=at + len(sentence))]
        return FactoidRecord(text=text, start=start, end=start + len(text), score=score, flagged=score >= 0.5,
                             label=label, reason=reason, evidence=places)

    others = [
        ("legal", "How much notice do I have to give? I've worked here for seven years.", _CONTRACT,
         "You have to give one month of notice, as for every employee.", 0.81,
         "You have to give one month of notice", "contradicted", "copies a context sentence but changes it (number)"),
        ("healthcare", "What is the maximum paracetamol dose per day?", _LEAFLET,
         "Adults can take up to 8 g of paracetamol in 24 hours.", 0.77, "up to 8 g", "contradicted",
         "copies a context sentence but changes it (number)"),
        ("legal", "Can they fire me during probation?", _CONTRACT,
         "During probation the employer must pay three months' salary to end the contract.", 0.64,
         "the employer must pay three months' salary", "unsupported",
         "not in the context: pay, salary"),
        ("healthcare", "Is ibuprofen fine while breastfeeding?", _LEAFLET,
         "Ibuprofen is the preferred painkiller for breastfeeding mothers.", 0.58,
         "Ibuprofen is the preferred painkiller for breastfeeding mothers.", "unsupported",
         "not in the context: preferred, mothers"),
        ("healthcare", "Which painkiller is first choice in pregnancy?", _LEAFLET,
         "Paracetamol is the first choice for pain relief during pregnancy.", 0.06, None, None, None),
    ]
    ids = []
    for n, (topic, question, context, text, score, part, label, reason) in enumerate(others):
        factoids = [claim(text, part, score, label, reason)] if part and label and reason else []
        ids.append(record(n, topic, question, context, text, score, factoids))
    answer = ("Yes, ibuprofen is safe throughout pregnancy. For pain, paracetamol is the first choice; take 2 g every "
              "4 hours. Ask a pharmacist before taking painkillers while breastfeeding.")
    first = "Yes, ibuprofen is safe throughout pregnancy."
    shown = record(5, "healthcare", "Can I take ibuprofen for back pain? I'm 32 weeks pregnant.", _LEAFLET, answer,
                   0.93, [
                       claim(answer, first, 0.93, "contradicted", "copies a context sentence but changes it (negation)",
                             (1, "Ibuprofen is contraindicated in the third trimester of pregnancy.", _LEAFLET)),
                       claim(answer, "safe throughout pregnancy", 0.93, "unsupported",
                             "the judge names it as not supported by the passages"),
                       claim(answer, first, 0.88, "unsupported", "the judge finds it stated nowhere in the context"),
                       claim(answer, "take 2 g every 4 hours", 0.71, "contradicted",
                             "copies a context sentence but changes it (number)",
                             (2, "The usual adult dose is 500 mg to 1 g every 4 to 6 hours, up to 4 g in 24 hours.",
                              _LEAFLET)),
                       claim(answer, "Ask a pharmacist before taking painkillers while breastfeeding.", 0.04,
                             "supported", "")],
                   action="block", escalated=True)
    # A stricter candidate in the shadow (sensitive topics blocked at a lower threshold): where it decides otherwise
    for n, (topic, _, _, _, score, *_rest) in enumerate(others):
        candidate = "block" if topic == "healthcare" and score >= 0.3 else "annotate" if score >= 0.3 else "pass"
        live = "annotate" if score >= 0.5 else "pass"
        outcome = Outcome(row_id=ids[n], request_id=f"example-{n}", time=day.isoformat(), profile="general",
                          topic=topic, live_action=live, live_flagged=score >= 0.5, action=candidate,
                          flagged=score >= 0.3, score=score, threshold=0.3)
        store.record_shadow(outcome.request_id, "stricter", outcome.changed, candidate, outcome.model_dump())
    reviews = ReviewStore(store)
    reviews.judge(ids[0], "bob", "hallucinated")
    reviews.judge(ids[1], "alice", "hallucinated")
    reviews.judge(ids[2], "bob", "faithful", note="the contract's notice clause covers it")
    reviews.take(ids[3], "bob")
    reviews.take(shown, REVIEWER)
    return shown


@contextmanager
def serving(console: ReviewConsole) -> Iterator[str]:
    """The console on a free loopback port while the block runs; yields its base URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(console.app(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the review console did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def capture(base: str, decision_id: int, out: Path, chromium: str | None = None) -> list[Path]:
    """Log in to the console at `base` and write the queue, the decision's page, the insights and the answers a
    shadow candidate decided otherwise as PNGs."""
    from playwright.sync_api import sync_playwright

    chromium = chromium or os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise RuntimeError("Chromium is not installed (apt-get install -y chromium), or set CHROMIUM")
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / name for name in NAMES]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800}, device_scale_factor=1)
            page.goto(base + "/login")
            page.fill("input[name=name]", REVIEWER)
            page.fill("input[name=key]", KEY)
            page.click("button[type=submit]")
            page.wait_for_url(base + "/queue")
            page.screenshot(path=str(paths[0]), full_page=True)
            page.goto(f"{base}/decisions/{decision_id}")
            page.screenshot(path=str(paths[1]), full_page=True)
            page.goto(base + "/insights")
            page.screenshot(path=str(paths[2]), full_page=True)
            page.goto(base + "/queue?shown=disagreed")
            page.screenshot(path=str(paths[3]), full_page=True)
        finally:
            browser.close()
    return paths


def regenerate(out: Path) -> list[Path]:
    """The example store in a scratch folder, the console over it, the screenshots into `out`."""
    with tempfile.TemporaryDirectory() as scratch:
        store = AuditStore(AuditSettings(path=str(Path(scratch) / "audit.db")))
        try:
            shown = example(store)
            console = ReviewConsole(ReviewSettings(secure_cookies=False), lambda: store, {REVIEWER: KEY},
                                    topics=["healthcare", "legal"])
            with serving(console) as base:
                return capture(base, shown, out)
        finally:
            store.close()


if __name__ == "__main__":
    for written in regenerate(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/images")):
        print(written)
