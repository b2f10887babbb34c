"""Chat streams checked as they flow, end to end: the official `openai` client → morphguard under uvicorn (default
stream settings) → the scripted provider, whose `echo` model streams back the user's message a word at a time,
so each test writes the answer it needs. The scripted judge supports a statement the context states word for
word."""

from __future__ import annotations

import sqlite3
import time

import openai
import pytest

PASSAGE = "Ibuprofen is contraindicated in the third trimester of pregnancy."
SECOND = "Paracetamol is the usual choice for pain in pregnancy."
INVENTED = "Ibuprofen is safe throughout pregnancy."
SAFE = "Withheld: the sources do not support this answer."


@pytest.fixture(scope="module")
def block_proxy(proxy_factory) -> str:
    return proxy_factory(policy={"safe_message": SAFE, "audit": {"store_text": "full"},
                                 "profiles": {"general": {"action": "block", "topics": {}}}})


@pytest.fixture(scope="module")
def highlight_proxy(proxy_factory) -> str:
    return proxy_factory(policy={"profiles": {"general": {"action": "highlight", "topics": {}}}})


def stream(base: str, answer: str, model: str = "echo") -> list:
    client = openai.OpenAI(base_url=base + "/v1", api_key="sk-client", max_retries=0, timeout=30)
    return list(client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": answer}], stream=True,
        extra_body={"morphguard": {"context": [f"{PASSAGE} {SECOND}"]}}))


def text_of(chunks: list) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def finish_of(chunks: list) -> str | None:
    return [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason][-1]


def audit_row(proxy_factory, base: str, request_id: str) -> dict:
    deadline = time.monotonic() + 10
    while True:
        with sqlite3.connect(proxy_factory.folders[base] / "audit.db") as db:
            db.row_factory = sqlite3.Row
            row = db.execute("SELECT * FROM decisions WHERE request_id = ?", (request_id,)).fetchone()
        if row is not None or time.monotonic() > deadline:
            assert row is not None, f"no audit row for {request_id}"
            return dict(row)
        time.sleep(0.1)


def test_a_flagged_sentence_never_leaves_and_the_stream_ends_as_a_content_filter_ends_it(block_proxy,
                                                                                         proxy_factory):
    chunks = stream(block_proxy, f"{PASSAGE} {INVENTED} Ask your doctor about it.")
    text = text_of(chunks)
    assert text == f"{PASSAGE} \n\n{SAFE}"  # the supported sentence went out; nothing of the rest
    assert "safe throughout" not in text and "doctor" not in text
    assert finish_of(chunks) == "content_filter"
    verdict = chunks[-1].model_extra["morphguard"]
    assert verdict["action"] == "block" and verdict["flagged"] is True
    assert [(s["start"], s["flagged"]) for s in verdict["sentences"]] == [(0, False), (len(PASSAGE) + 1, True)]
    row = audit_row(proxy_factory, block_proxy, verdict["request_id"])
    assert (row["action"], row["flagged"]) == ("block", 1)
    assert row["answer"].startswith(f"{PASSAGE} {INVENTED}")  # the audit keeps what the model said


def test_a_supported_answer_streams_whole_with_the_whole_answer_verdict_last(block_proxy, proxy_factory):
    answer = f"{PASSAGE} {SECOND}"  # each sentence, and the whole, stated by the context word for word
    chunks = stream(block_proxy, answer)
    assert text_of(chunks) == answer
    assert finish_of(chunks) == "stop"
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) == len(answer.split())
    verdict = chunks[-1].model_extra["morphguard"]
    assert verdict["action"] == "pass" and verdict["checked"] is True and verdict["flagged"] is False
    assert [s["flagged"] for s in verdict["sentences"]] == [False, False]
    assert audit_row(proxy_factory, block_proxy, verdict["request_id"])["action"] == "pass"


def test_a_flagged_last_sentence_is_withheld_too(block_proxy):
    chunks = stream(block_proxy, f"{PASSAGE} {INVENTED}")
    assert text_of(chunks) == f"{PASSAGE} \n\n{SAFE}"
    assert finish_of(chunks) == "content_filter"


def test_an_upstream_that_breaks_mid_stream_sends_nothing_unchecked_and_the_client_raises(block_proxy,
                                                                                         proxy_factory):
    client = openai.OpenAI(base_url=block_proxy + "/v1", api_key="sk-client", max_retries=0, timeout=30)
    seen: list = []
    with pytest.raises(openai.APIError):
        for chunk in client.chat.completions.create(
                model="reset-stream", messages=[{"role": "user", "content": "Can I take it?"}], stream=True,
                extra_body={"morphguard": {"context": [PASSAGE]}}):
            seen.append(chunk)
    assert text_of(seen) == ""  # the reset came mid-sentence: that sentence was never checked, so never sent


def test_under_highlight_flagged_sentences_go_out_with_their_verdicts(highlight_proxy, proxy_factory):
    chunks = stream(highlight_proxy, f"{INVENTED} {PASSAGE}")
    assert text_of(chunks) == f"{INVENTED} {PASSAGE}"  # sent as it flowed: the verdict travels beside it
    per_sentence = [c.model_extra["morphguard"] for c in chunks[:-1] if "morphguard" in (c.model_extra or {})]
    assert per_sentence and per_sentence[0]["sentences"][0] == {"start": 0, "end": len(INVENTED), "flagged": True,
                                                               "score": 1.0}
    verdict = chunks[-1].model_extra["morphguard"]
    assert verdict["flagged"] is True and verdict["action"] == "annotate"
    assert "already sent" in verdict["reason"]
    assert audit_row(proxy_factory, highlight_proxy, verdict["request_id"])["action"] == "annotate"
