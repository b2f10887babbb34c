"""Each dialect's stream and answer readings agree with each other: a response replayed as a stream assembles back
into the same answer, its text deltas add up to that answer's text, a content-filter ending reads as a refused
answer saying the given text, and the verdict rides on the stream's ending."""

from __future__ import annotations

import pytest

from morphguard.policy.answers import checked_text, message_of, prose
from morphguard.proxy.dialects.base import Dialect, Event
from morphguard.proxy.dialects.chat import ChatCompletions
from morphguard.proxy.dialects.messages import Messages
from morphguard.proxy.dialects.responses import Responses
from morphguard.proxy.errors import ProxyError

TEXT = "The clinic opens at 9 am on weekdays."

RESPONSES = {
    "chat": {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
             "choices": [{"index": 0, "finish_reason": "stop",
                          "message": {"role": "assistant", "content": TEXT,
                                      "tool_calls": [{"id": "c1", "type": "function",
                                                      "function": {"name": "f", "arguments": '{"a": 1}'}}]}}]},
    "responses": {"id": "resp_1", "object": "response", "status": "completed", "model": "m",
                  "output": [{"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                              "content": [{"type": "output_text", "text": TEXT, "annotations": []}]}]},
    "messages": {"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "stop_reason": "end_turn",
                 "content": [{"type": "text", "text": TEXT}], "usage": {"input_tokens": 3, "output_tokens": 9}},
}
DIALECTS: dict[str, Dialect] = {"chat": ChatCompletions(), "responses": Responses(), "messages": Messages()}


def assembled(dialect: Dialect, events: list[Event]) -> tuple[dict, str, Event | None]:
    assembly = dialect.assembly()
    last = None
    deltas = []
    for event in events:
        deltas.append(dialect.delta(event))
        if assembly.add(event):
            last = event
            break
    assembly.finish()
    return assembly.completion(), "".join(deltas), last


@pytest.mark.parametrize("name", DIALECTS)
def test_a_replayed_response_assembles_back_into_its_answer(name):
    dialect, response = DIALECTS[name], RESPONSES[name]
    completion, deltas, last = assembled(dialect, dialect.replay(response))
    assert message_of(completion)["content"] == TEXT == deltas
    assert prose(dialect.completion(response)) == TEXT
    assert last is not None


@pytest.mark.parametrize("name", DIALECTS)
def test_a_content_filter_ending_is_a_refused_answer_saying_the_text(name):
    dialect = DIALECTS[name]
    events = dialect.filtered_ending(RESPONSES[name], "Withheld.")
    completion, deltas, _ = assembled(dialect, events)
    assert checked_text(completion) == "Withheld."  # as the answer's text, or as its refusal (Responses)
    assert deltas == ("" if name == "responses" else "Withheld.")
    ended = dialect.assembly()
    for event in events:
        ended.add(event)
    response = ended.response()
    assert response is not None
    if name == "chat":
        assert response["choices"][0]["finish_reason"] == "content_filter"
        assert "tool_calls" not in response["choices"][0]["message"]
    elif name == "responses":
        assert (response["status"], response["incomplete_details"]) == ("incomplete", {"reason": "content_filter"})
    else:
        assert response["stop_reason"] == "refusal"


@pytest.mark.parametrize("name", DIALECTS)
def test_the_verdict_rides_on_the_streams_ending(name):
    dialect, response = DIALECTS[name], RESPONSES[name]
    *_, last = dialect.replay(response)
    ending = dialect.with_verdict(last, {"checked": True}, response)
    assert ending[0].json()["morphguard"] == {"checked": True}  # the verdict's own event
    if name == "chat":
        assert ending[-1].data == "[DONE]"
    elif name == "responses":
        assert ending[-1].json()["response"]["morphguard"] == {"checked": True}
    else:
        assert ending[-1].name == "message_stop" and ending[-1].json()["morphguard"] == {"checked": True}


@pytest.mark.parametrize("name", DIALECTS)
def test_a_stream_cut_before_its_end_is_broken(name):
    dialect = DIALECTS[name]
    events = dialect.replay(RESPONSES[name])[:1]
    assembly = dialect.assembly()
    for event in events:
        assembly.add(event)
    with pytest.raises(ProxyError) as caught:
        assembly.finish()
    assert caught.value.code == "upstream_stream_broken"


def test_a_chat_event_that_is_no_chunk_breaks_the_stream():
    with pytest.raises(ProxyError) as caught:
        ChatCompletions().assembly().add(Event(None, '["not", "a", "chunk"]'))
    assert caught.value.code == "upstream_malformed"
