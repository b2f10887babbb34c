"""Streams checked as they flow, end to end on all three APIs: the official `openai` (chat completions and
Responses) and `anthropic` (Messages) clients and their stream helpers → morphguard under uvicorn with the
DEFAULT stream settings → the scripted provider, whose `echo` model streams back the user's message a word at a
time, so each test writes the answer it needs. The scripted judge supports a statement the context states word
for word. Under a `block` profile a flagged sentence never leaves, and the stream ends as the provider's own
refusal, which the SDK helpers read without raising."""

from __future__ import annotations

import sqlite3
import time
from typing import TYPE_CHECKING

import httpx
import openai
import pydantic
import pytest

from morphguard.detectors.grounding import Grounding, GroundingSettings
from morphguard.models import RagInput
from tests.e2e.conftest import audit_row
from tests.scripted_llm import sentences_score

if TYPE_CHECKING:  # imported where it is used (tests/clients/conftest.py says why)
    import anthropic

PASSAGE = "Ibuprofen is contraindicated in the third trimester of pregnancy."
SECOND = "Paracetamol is the usual choice for pain in pregnancy."
INVENTED = "Ibuprofen is safe throughout pregnancy."
AFTER = "Ask your doctor about it."
SAFE = "Withheld: the sources do not support this answer."
CONTEXT = {"morphguard": {"context": [f"{PASSAGE} {SECOND}"]}}


# Evidence that adds up: each sentence has one word the context lacks and passes `grounding` alone (0.22 < 0.3);
# two of them score 0.39 and the three 0.53, and block.
VISIT = ["The museum opens at nine on weekdays, reliably.", "The entry ticket is twenty euros, cash.",
         "Parking is behind the building, free."]
VISIT_CONTEXT = ("The museum opens at nine on weekdays. The entry ticket is twenty euros. "
                 "Parking is behind the building.")
VISIT_QUESTION = {"morphguard": {"context": [VISIT_CONTEXT]}}
# The echo model repeats the last message: the answer comes after the question, so its words are not the question's
# (which count as supported).
VISIT_ASKED = "When can I go, and what does it cost?"
VISIT_MESSAGES = [{"role": "user", "content": VISIT_ASKED}, {"role": "assistant", "content": " ".join(VISIT)}]


class Advice(pydantic.BaseModel):  # a structured output asked for: the refusal is not parsed as one, no error
    answer: str


@pytest.fixture(scope="module")
def block_proxy(proxy_factory) -> str:
    return proxy_factory(policy={"safe_message": SAFE, "audit": {"store_text": "full"},
                                 "profiles": {"general": {"action": "block", "topics": {}}}})


@pytest.fixture(scope="module")
def grounding_proxy(proxy_factory) -> str:
    return proxy_factory(detector="grounding", policy={"safe_message": SAFE, "audit": {"store_text": "full"},
                                                       "profiles": {"general": {"action": "block", "topics": {}}}})


@pytest.fixture(scope="module")
def highlight_proxy(proxy_factory) -> str:
    return proxy_factory(policy={"profiles": {"general": {"action": "highlight", "topics": {}}}})


@pytest.fixture(scope="module")
def annotate_proxy(proxy_factory) -> str:
    return proxy_factory()


def oai(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key="sk-client", max_retries=0, timeout=30)


def claude(base: str) -> anthropic.Anthropic:
    import anthropic

    return anthropic.Anthropic(base_url=base, api_key="sk-ant-client", max_retries=0, timeout=30)


def chat_stream(base: str, answer: str, model: str = "echo") -> list:
    return list(oai(base).chat.completions.create(
        model=model, messages=[{"role": "user", "content": answer}], stream=True, extra_body=CONTEXT))


def text_of(chunks: list) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)



def assert_blocked_and_audited(proxy_factory, base: str, verdict: dict) -> None:
    assert verdict["action"] == "block" and verdict["flagged"] is True
    entries = [(s["start"], s["flagged"]) for s in verdict["sentences"]]
    assert entries[:2] == [(0, False), (len(PASSAGE) + 1, True)]
    # the sentence after it, where the check had it before it blocked (a stream that came at once): not stated either
    assert all(flagged for _, flagged in entries[2:]) and len(entries) <= 3
    row = audit_row(proxy_factory, base, verdict["request_id"])
    assert (row["action"], row["flagged"]) == ("block", 1)
    assert row["answer"].startswith(f"{PASSAGE} {INVENTED}")  # the audit keeps what the model said


def grounding_score(text: str) -> float:
    rag = RagInput(question=VISIT_ASKED, passages=[VISIT_CONTEXT])
    return Grounding(GroundingSettings(), 0.3).measure(rag, text).score


def assert_only_a_passing_prefix_went_out(proxy_factory, base: str, said: str, verdict: dict) -> None:
    """What the client received of the answer is a prefix of it that passed the check that blocked the answer;
    the verdict and the audit row say `block` of the rest only, and that what went passed."""
    answer = " ".join(VISIT)
    assert said == f"{VISIT[0]} "  # the second sentence tips the sum: it and the rest never leave
    assert grounding_score(said) < 0.3 <= grounding_score(answer[:len(VISIT[0]) + 1 + len(VISIT[1])])
    assert verdict["action"] == "block" and verdict["flagged"] is True
    assert (verdict["released_chars"], verdict["released_flagged"]) == (len(said), False)
    assert verdict["released_score"] == round(grounding_score(said), 4)
    assert [s["flagged"] for s in verdict["sentences"]][:1] == [False]
    row = audit_row(proxy_factory, base, verdict["request_id"])
    assert (row["action"], row["released_chars"], row["released_flagged"]) == ("block", len(said), 0)
    assert row["released_score"] < row["threshold"] <= row["score"]


# --- chat completions ----------------------------------------------------------------------------------------

def test_chat_a_flagged_sentence_never_leaves_and_the_stream_ends_as_a_refusal(block_proxy, proxy_factory):
    with oai(block_proxy).chat.completions.stream(
            model="echo", messages=[{"role": "user", "content": f"{PASSAGE} {INVENTED} {AFTER}"}],
            extra_body=CONTEXT) as stream:
        chunks = [e.chunk for e in stream if e.type == "chunk"]
        final = stream.get_final_completion()
    text = text_of(chunks)
    assert text == f"{PASSAGE} \n\n{SAFE}"  # the supported sentence went out; nothing of the rest
    assert "safe throughout" not in text and "doctor" not in text
    choice = final.choices[0]
    assert (choice.finish_reason, choice.message.refusal) == ("stop", SAFE)
    assert_blocked_and_audited(proxy_factory, block_proxy, chunks[-1].model_extra["morphguard"])


def test_chat_a_supported_answer_streams_whole_with_the_whole_answer_verdict_last(block_proxy, proxy_factory):
    answer = f"{PASSAGE} {SECOND}"  # each sentence, and the whole, stated by the context word for word
    chunks = chat_stream(block_proxy, answer)
    assert text_of(chunks) == answer
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) == len(answer.split())
    verdict = chunks[-1].model_extra["morphguard"]
    assert verdict["action"] == "pass" and verdict["checked"] is True and verdict["flagged"] is False
    assert [s["flagged"] for s in verdict["sentences"]] == [False, False]
    assert audit_row(proxy_factory, block_proxy, verdict["request_id"])["action"] == "pass"


def test_chat_a_flagged_last_sentence_is_withheld_too(block_proxy):
    chunks = chat_stream(block_proxy, f"{PASSAGE} {INVENTED}")
    assert text_of(chunks) == f"{PASSAGE} \n\n{SAFE}"
    assert [c.choices[0].delta.refusal for c in chunks if c.choices and c.choices[0].delta.refusal] == [SAFE]


def test_chat_an_upstream_that_breaks_mid_stream_sends_nothing_unchecked_and_the_client_raises(block_proxy):
    seen: list = []
    with pytest.raises(openai.APIError):
        for chunk in oai(block_proxy).chat.completions.create(
                model="reset-stream", messages=[{"role": "user", "content": "Can I take it?"}], stream=True,
                extra_body={"morphguard": {"context": [PASSAGE]}}):
            seen.append(chunk)
    assert text_of(seen) == ""  # the reset came mid-sentence: that sentence was never checked, so never sent


def test_chat_evidence_adding_up_over_sentences_blocks_before_any_of_it_leaves(grounding_proxy, proxy_factory):
    chunks = list(oai(grounding_proxy).chat.completions.create(
        model="echo", messages=VISIT_MESSAGES, stream=True, extra_body=VISIT_QUESTION))
    said = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices and not c.choices[0].delta.refusal)
    assert [c.choices[0].delta.refusal for c in chunks if c.choices and c.choices[0].delta.refusal] == [SAFE]
    assert_only_a_passing_prefix_went_out(proxy_factory, grounding_proxy, said, chunks[-1].model_extra["morphguard"])


def test_chat_under_highlight_flagged_sentences_go_out_with_their_verdicts(highlight_proxy, proxy_factory):
    chunks = chat_stream(highlight_proxy, f"{INVENTED} {PASSAGE}")
    assert text_of(chunks) == f"{INVENTED} {PASSAGE}"  # sent as it flowed: the verdict travels beside it
    per_sentence = [c.model_extra["morphguard"] for c in chunks[:-1] if "morphguard" in (c.model_extra or {})]
    flagged = round(sentences_score(whole=True, sentence=True), 4)
    assert per_sentence and per_sentence[0]["sentences"][0] == {"start": 0, "end": len(INVENTED), "flagged": True,
                                                               "score": flagged}
    verdict = chunks[-1].model_extra["morphguard"]
    assert verdict["flagged"] is True and verdict["action"] == "annotate"
    assert "already sent" in verdict["reason"]
    assert audit_row(proxy_factory, highlight_proxy, verdict["request_id"])["action"] == "annotate"


def test_chat_under_annotate_a_stream_passes_through_unchanged(annotate_proxy, proxy_factory):
    chunks = chat_stream(annotate_proxy, f"{INVENTED} {AFTER}")
    assert text_of(chunks) == f"{INVENTED} {AFTER}"
    verdict = chunks[-1].model_extra["morphguard"]
    assert verdict["flagged"] is True and verdict["action"] == "annotate" and "sentences" not in verdict
    assert audit_row(proxy_factory, annotate_proxy, verdict["request_id"])["action"] == "annotate"


# --- Responses ----------------------------------------------------------------------------------------------

def test_responses_a_flagged_sentence_never_leaves_and_the_stream_ends_as_a_refusal(block_proxy, proxy_factory):
    with oai(block_proxy).responses.stream(model="echo", input=f"{PASSAGE} {INVENTED} {AFTER}",
                                           text_format=Advice, extra_body=CONTEXT) as stream:
        events = list(stream)
        final = stream.get_final_response()
    said = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert said == f"{PASSAGE} "
    assert not any("safe throughout" in e.model_dump_json() for e in events[:-2])
    assert [e.delta for e in events if e.type == "response.refusal.delta"] == [SAFE]
    assert final.status == "completed" and final.output_parsed is None
    assert [part.model_dump() for part in final.output[0].content] == [{"type": "refusal", "refusal": SAFE}]
    kinds = [e.type for e in events]
    assert kinds[-2:] == ["morphguard.verdict", "response.completed"]
    verdict = events[-2].model_extra["morphguard"]
    assert events[-1].response.model_extra["morphguard"] == verdict
    assert_blocked_and_audited(proxy_factory, block_proxy, verdict)


def test_responses_a_supported_answer_streams_whole_and_is_audited(block_proxy, proxy_factory):
    answer = f"{PASSAGE} {SECOND}"
    with oai(block_proxy).responses.stream(model="echo", input=answer, extra_body=CONTEXT) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert final.output_text == answer and final.status == "completed"
    verdict = final.model_extra["morphguard"]
    assert verdict["action"] == "pass" and [s["flagged"] for s in verdict["sentences"]] == [False, False]
    assert [e.type for e in events][-2:] == ["morphguard.verdict", "response.completed"]
    assert audit_row(proxy_factory, block_proxy, verdict["request_id"])["action"] == "pass"


def test_responses_evidence_adding_up_over_sentences_blocks_before_any_of_it_leaves(grounding_proxy,
                                                                                      proxy_factory):
    with oai(grounding_proxy).responses.stream(model="echo", input=VISIT_MESSAGES,
                                               extra_body=VISIT_QUESTION) as stream:
        events = list(stream)
    said = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert [e.delta for e in events if e.type == "response.refusal.delta"] == [SAFE]
    verdict = events[-2].model_extra["morphguard"]
    assert_only_a_passing_prefix_went_out(proxy_factory, grounding_proxy, said, verdict)


def test_responses_under_annotate_a_stream_passes_through_unchanged(annotate_proxy):
    with oai(annotate_proxy).responses.stream(model="echo", input=f"{INVENTED} {AFTER}",
                                              extra_body=CONTEXT) as stream:
        final = stream.get_final_response()
    assert final.output_text == f"{INVENTED} {AFTER}"
    assert final.model_extra["morphguard"]["action"] == "annotate"


# --- Messages -----------------------------------------------------------------------------------------------

def test_messages_a_flagged_sentence_never_leaves_and_the_stream_ends_as_a_refusal(block_proxy, proxy_factory):
    with claude(block_proxy).messages.stream(
            model="echo", max_tokens=100, messages=[{"role": "user", "content": f"{PASSAGE} {INVENTED} {AFTER}"}],
            extra_body=CONTEXT) as stream:
        events = list(stream)
        final = stream.get_final_message()
    said = "".join(e.text for e in events if e.type == "text")
    assert said == f"{PASSAGE} \n\n{SAFE}"
    assert final.stop_reason == "refusal"
    assert final.stop_details is not None and final.stop_details.explanation == SAFE
    assert [block.text for block in final.content] == [said]
    verdicts = [e.model_extra["morphguard"] for e in events if e.type == "morphguard.verdict"]
    assert len(verdicts) == 1 and events[-1].type == "message_stop"
    assert_blocked_and_audited(proxy_factory, block_proxy, verdicts[0])


def test_messages_a_supported_answer_streams_whole_and_is_audited(block_proxy, proxy_factory):
    answer = f"{PASSAGE} {SECOND}"
    with claude(block_proxy).messages.stream(model="echo", max_tokens=100,
                                             messages=[{"role": "user", "content": answer}],
                                             extra_body=CONTEXT) as stream:
        events = list(stream)
        final = stream.get_final_message()
    assert "".join(e.text for e in events if e.type == "text") == answer and final.stop_reason == "end_turn"
    verdicts = [e.model_extra["morphguard"] for e in events if e.type == "morphguard.verdict"]
    assert len(verdicts) == 1 and events[-1].type == "message_stop"
    verdict = verdicts[0]
    assert verdict["action"] == "pass" and [s["flagged"] for s in verdict["sentences"]] == [False, False]
    assert audit_row(proxy_factory, block_proxy, verdict["request_id"])["action"] == "pass"


def test_messages_evidence_adding_up_over_sentences_blocks_before_any_of_it_leaves(grounding_proxy,
                                                                                     proxy_factory):
    with claude(grounding_proxy).messages.stream(
            model="echo", max_tokens=100, messages=VISIT_MESSAGES, extra_body=VISIT_QUESTION) as stream:
        events = list(stream)
        final = stream.get_final_message()
    said = "".join(e.text for e in events if e.type == "text")
    assert final.stop_reason == "refusal" and said.endswith(f"\n\n{SAFE}")
    verdicts = [e.model_extra["morphguard"] for e in events if e.type == "morphguard.verdict"]
    assert len(verdicts) == 1
    assert_only_a_passing_prefix_went_out(proxy_factory, grounding_proxy, said.removesuffix(f"\n\n{SAFE}"),
                                          verdicts[0])


def test_messages_under_annotate_a_stream_passes_through_unchanged(annotate_proxy):
    with claude(annotate_proxy).messages.stream(model="echo", max_tokens=100,
                                                messages=[{"role": "user", "content": f"{INVENTED} {AFTER}"}],
                                                extra_body=CONTEXT) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == f"{INVENTED} {AFTER}" and final.stop_reason == "end_turn"


# --- the judge's cost of a stream -------------------------------------------------------------------------------


def test_a_stream_checked_as_it_flows_asks_the_judge_about_each_sentence_once(proxy_factory, provider):
    """The echo model writes a word every 10 ms and the judge answers in 100 ms: the answer is checked up to each
    finished sentence several times, then whole. Each check asks only about the sentences no check before it asked
    (or is asking), so every sentence reaches the judge once however many checks read it."""
    import httpx

    from tests.scripted_llm import asked_sentences

    base = proxy_factory(judge_model="openai/judge-100ms",
                         policy={"profiles": {"general": {"action": "block", "topics": {}}}})
    said = [f"Station {name} opens its western gate at dawn." for name in
            ("Aldgate", "Bermondsey", "Clapham", "Dalston", "Euston", "Fulham", "Greenwich", "Hackney", "Islington",
             "Kennington", "Lambeth", "Marylebone", "Norwood", "Oval")]
    answer = " ".join(said)
    chunks = list(oai(base).chat.completions.create(
        model="echo", messages=[{"role": "user", "content": answer}], stream=True,
        extra_body={"morphguard": {"context": [answer]}}))
    assert text_of(chunks) == answer and chunks[-1].morphguard["action"] == "pass"
    calls = [body for r in httpx.get(provider.removesuffix("/v1") + "/_requests", timeout=10).json()
             if "sentences are numbered" in str((body := r["body"])["messages"][0]["content"])
             and "Station Aldgate" in str(body["messages"][-1]["content"])]
    asked = [sentence for body in calls for _, sentence in asked_sentences(body["messages"][-1]["content"])]
    assert len(calls) >= 3  # checked as it flowed, in several checks
    assert sorted(asked) == sorted(said)  # each sentence asked once


# A list answer longer than the stream's judge calls can read (`max_judge_calls: 6`, one sentence a call): the echo
# model writes a word every 10 ms and the judge takes 2 s a call, so the check after the first line finds a dozen
# lines finished, more than the calls left can ask about.
DEPOTS = [f"Depot {n} ships parcels on weekdays." for n in range(1, 61)]
SAFE_DEFAULT = "Please check the source documents or ask a specialist."


def judged_lines(provider: str, marker: str) -> list[str]:
    """Every sentence the `sentences` check asked the judge about, over the calls whose answer holds `marker`."""
    import httpx

    from tests.scripted_llm import asked_sentences

    bodies = [r["body"] for r in httpx.get(provider.removesuffix("/v1") + "/_requests", timeout=10).json()]
    return [sentence for body in bodies if "sentences are numbered" in str(body["messages"][0]["content"])
            and marker in str(body["messages"][-1]["content"])
            for _, sentence in asked_sentences(body["messages"][-1]["content"])]


def capped_proxy(proxy_factory, on_error: str) -> str:
    return proxy_factory(judge_model="openai/judge-2000ms", detector_settings={"max_judge_calls": 6},
                         sections={"sentences": {"batch": 1}},
                         policy={"profiles": {"general": {"action": "block", "on_error": on_error, "topics": {}}}})


def depots_stream(base: str, answer: str, context: str) -> list:
    return list(oai(base).chat.completions.create(
        model="echo", messages=[{"role": "user", "content": answer}], stream=True,
        extra_body={"morphguard": {"context": [context]}}))


def test_past_the_streams_cap_an_invented_line_under_it_is_still_caught(proxy_factory):
    base = capped_proxy(proxy_factory, "fail_open")
    lines = [*DEPOTS[:2], "Depot 3 ships parcels by airship.", *DEPOTS[3:]]
    chunks = depots_stream(base, "\n".join(lines), "\n".join(DEPOTS))
    verdict = chunks[-1].morphguard
    assert (verdict["action"], verdict["flagged"]) == ("block", True)  # what fits is read, and decides
    assert "airship" not in text_of(chunks) and verdict["reason"] == "read in part: judge_call_cap"


@pytest.mark.parametrize("on_error", ["fail_closed", "fail_open"])
def test_past_the_streams_cap_the_unchecked_rest_is_withheld_or_passed_marked_as_the_profile_says(
        proxy_factory, provider, on_error):
    base = capped_proxy(proxy_factory, on_error)
    marker = f"Depot 1 ships parcels on weekdays, {on_error}."  # tells this stream's judge calls apart
    answer = "\n".join([marker, *DEPOTS[1:]])
    chunks = depots_stream(base, answer, "\n".join([marker, *DEPOTS[1:]]))
    said, verdict = text_of(chunks), chunks[-1].morphguard
    judged = judged_lines(provider, marker)
    assert len(judged) <= 6 and len(set(judged)) == len(judged)  # the stream's calls, each sentence once
    assert verdict["reason"] == f"{on_error}: judge_call_cap"
    if on_error == "fail_open":
        assert said == answer and verdict["action"] == "pass"  # passed, and marked as not read through
        return
    released = said[:verdict["released_chars"]]
    assert verdict["action"] == "block" and answer.startswith(released) and said.endswith(SAFE_DEFAULT)
    released_lines = [line for line in released.splitlines() if line.strip()]
    assert set(released_lines) <= set(judged)  # nothing the judge was not asked about went out
    assert len(released_lines) == len(judged) == 6  # what the checks read went out, up to the unread rest


@pytest.mark.parametrize("proxy", ["block_proxy", "annotate_proxy"])
def test_a_client_that_leaves_a_stream_is_audited_as_gone_with_what_it_was_sent(proxy, proxy_factory, request):
    """Checked as it flows (`block`) or passed through (`annotate`): the row says the client left, and how much of
    the answer's text it had been sent."""
    base = request.getfixturevalue(proxy)
    answer = " ".join([PASSAGE, SECOND] * 10)  # supported, sentence after sentence
    body = {"model": "echo", "stream": True, "messages": [{"role": "user", "content": answer}], **CONTEXT}
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=30) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        for _ in range(40):  # a few sentences, then the client hangs up
            next(lines)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        with sqlite3.connect(proxy_factory.folders[base] / "audit.db") as db:
            db.row_factory = sqlite3.Row
            row = db.execute("SELECT * FROM decisions ORDER BY id DESC LIMIT 1").fetchone()
        if row is not None and row["question"] == answer:
            break
        time.sleep(0.1)
    assert (row["reason"], row["checked"]) == ("client_disconnected", 0)
    assert 0 < row["released_chars"] < len(answer)
