"""Each dialect's stream and answer readings agree with each other: a response replayed as a stream assembles back
into the same answer, its text deltas add up to that answer's text, a refused ending (mid-answer or not) reads
as the provider's refusal saying the given text, and the verdict rides on the stream's ending."""

from __future__ import annotations

import pytest

from morphguard.policy.answers import checked_text, message_of, prose, unreadable
from morphguard.proxy.dialects.base import Dialect, Event, event_of
from morphguard.proxy.dialects.chat import DONE, ChatCompletions
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


class AsTheSdkReads(Responses):
    """The Responses stream read as the SDK reads it: its events and its last event's response each for what they
    say, not weighed against each other as the upstream's are."""

    @staticmethod
    def disagrees(events, said, text):
        return None


def assembled(dialect: Dialect, events: list[Event]) -> tuple[dict, str, Event | None]:
    assembly = dialect.assembly()
    last = None
    deltas = []
    for event in events:
        if assembly.add(event):
            last = event
            break
        deltas.append(assembly.added)
    assembly.finish()
    return assembly.completion(), "".join(deltas), last


@pytest.mark.parametrize("name", DIALECTS)
def test_a_replayed_response_assembles_back_into_its_answer(name):
    dialect, response = DIALECTS[name], RESPONSES[name]
    completion, deltas, last = assembled(dialect, dialect.replay(response))
    assert message_of(completion)["content"] == TEXT == deltas
    assert prose(dialect.completion(response)) == TEXT
    assert last is not None


def cut_at_first_text(dialect: Dialect, events: list[Event], *, with_it: bool) -> list[Event]:
    """The events of a stream up to its first text delta (with it: cut short mid-answer), as sent."""
    assembly = dialect.assembly()
    first = next(i for i, e in enumerate(events) if not assembly.add(e) and assembly.added)
    return events[:first + 1] if with_it else events[:first]


@pytest.mark.parametrize("cut", [True, False], ids=["mid-answer", "before-any-text"])
@pytest.mark.parametrize("name", DIALECTS)
def test_a_refused_ending_is_the_providers_own_refusal_saying_the_text(name, cut):
    dialect, response = DIALECTS[name], RESPONSES[name]
    replayed = dialect.replay(response)
    sent = cut_at_first_text(dialect, replayed, with_it=cut)
    ending = dialect.refused_ending(sent, "Withheld.")
    if name == "responses":  # its `response.completed` leaves out the text that went before, on purpose (the SDK
        dialect = AsTheSdkReads()  # would parse it as the format): read as a client reads it, not as the upstream's
    completion, deltas, last = assembled(dialect, [*sent, *ending])
    assert last == ending[-1]  # the stream's own last event: `with_verdict` takes it
    said = TEXT if cut else ""
    message = message_of(completion)
    assembly = dialect.assembly()
    for event in [*sent, *ending]:
        assembly.add(event)
    ended = assembly.response()
    assert ended is not None
    if name == "chat":
        assert message["refusal"] == "Withheld."
        assert message["content"] == (f"{said}\n\nWithheld." if cut else "Withheld.")
        assert deltas == message["content"] + message["refusal"]  # every field's words, in the order they came
        assert ended["choices"][0]["finish_reason"] == "stop"
    elif name == "responses":
        assert (ended["status"], ended["incomplete_details"]) == ("completed", None)
        assert [i["content"] for i in ended["output"]] == [[{"type": "refusal", "refusal": "Withheld."}]]
        assert message["content"] == "" and message["refusal"] == "Withheld."
        names = [e.name for e in ending]
        assert "response.output_text.done" not in names  # a partial text must not be parsed as the format
        assert names[-5:] == ["response.refusal.delta", "response.refusal.done", "response.content_part.done",
                              "response.output_item.done", "response.completed"]
        seqs = [e.json()["sequence_number"] for e in [*sent, *ending]]
        assert seqs == sorted(set(seqs))
    else:
        assert message["content"] == (f"{said}\n\nWithheld." if cut else "Withheld.") == deltas
        assert ended["stop_reason"] == "refusal"
        delta = next(e.json() for e in ending if e.name == "message_delta")["delta"]
        assert delta["stop_details"] == {"type": "refusal", "category": None, "explanation": "Withheld."}
    assert "Withheld." in checked_text(completion)


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


# --- one reader: the words each event adds are the whole answer's, once each, from every field ------------------

def chat_chunk(delta: dict, finish: str | None = None) -> Event:
    return event_of(None, {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


def responses_event(name: str, **data: object) -> Event:
    return event_of(name, {"type": name, **data})


AT = {"output_index": 0, "item_id": "msg_1", "content_index": 0}
PART = {"type": "output_text", "text": TEXT, "annotations": []}
ITEM = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed", "content": [PART]}
WORDS = TEXT.split(" ")
PIECES = [w + " " for w in WORDS[:-1]] + [WORDS[-1]]
COMPLETED = responses_event("response.completed", response={**RESPONSES["responses"], "output": [ITEM]})
START = event_of("message_start", {"type": "message_start", "message": {**RESPONSES["messages"], "content": []}})
STOP = [event_of("content_block_stop", {"type": "content_block_stop", "index": 0}),
        event_of("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"}}),
        event_of("message_stop", {"type": "message_stop"})]

STREAMS = {
    "chat-audio-transcript": ("chat", [chat_chunk({"audio": {"id": "a1", "transcript": p}}) for p in PIECES]
                              + [chat_chunk({"audio": {"data": "UklGRg=="}}), chat_chunk({}, "stop"), DONE]),
    "chat-content-parts": ("chat", [chat_chunk({"content": [{"type": "text", "text": p}]}) for p in PIECES]
                           + [chat_chunk({}, "stop"), DONE]),
    "chat-output-text-parts": ("chat", [chat_chunk({"content": [{"type": "output_text", "text": p}]}) for p in PIECES]
                               + [chat_chunk({}, "stop"), DONE]),
    "chat-refusal": ("chat", [chat_chunk({"refusal": p}) for p in PIECES] + [chat_chunk({}, "stop"), DONE]),
    "responses-deltas-then-whole": ("responses", [
        responses_event("response.output_item.added", output_index=0, item={**ITEM, "content": []}),
        responses_event("response.content_part.added", **AT, part={**PART, "text": ""}),
        *(responses_event("response.output_text.delta", **AT, delta=p) for p in PIECES),
        responses_event("response.output_text.done", **AT, text=TEXT),
        responses_event("response.content_part.done", **AT, part=PART),
        responses_event("response.output_item.done", output_index=0, item=ITEM), COMPLETED]),
    "responses-done-only": ("responses", [
        responses_event("response.content_part.added", **AT, part={**PART, "text": ""}),
        responses_event("response.output_text.done", **AT, text=TEXT),
        responses_event("response.content_part.done", **AT, part=PART),
        responses_event("response.output_item.done", output_index=0, item=ITEM), COMPLETED]),
    "responses-item-only": ("responses", [
        responses_event("response.output_item.added", output_index=0, item={**ITEM, "content": []}),
        responses_event("response.output_item.done", output_index=0, item=ITEM), COMPLETED]),
    "responses-half-in-deltas": ("responses", [
        responses_event("response.output_text.delta", **AT, delta=PIECES[0]),
        responses_event("response.output_text.done", **AT, text=TEXT), COMPLETED]),
    "responses-audio-transcript": ("responses", [  # the words only in the transcript: the response holds no output
        *(responses_event("response.audio.transcript.delta", delta=p) for p in PIECES),
        responses_event("response.audio.delta", delta="UklGRg=="), responses_event("response.audio.transcript.done"),
        responses_event("response.completed", response={**RESPONSES["responses"], "output": []})]),
    "responses-audio-transcript-whole": ("responses", [  # a server that says the transcript whole at its end too
        *(responses_event("response.audio.transcript.delta", delta=p) for p in PIECES[:2]),
        responses_event("response.audio.transcript.done", transcript=TEXT),
        responses_event("response.completed", response={**RESPONSES["responses"], "output": []})]),
    "messages-start-only": ("messages", [
        START, event_of("content_block_start", {"type": "content_block_start", "index": 0,
                                                "content_block": {"type": "text", "text": TEXT}}), *STOP]),
    "messages-start-then-deltas": ("messages", [
        START, event_of("content_block_start", {"type": "content_block_start", "index": 0,
                                                "content_block": {"type": "text", "text": PIECES[0]}}),
        *(event_of("content_block_delta", {"type": "content_block_delta", "index": 0,
                                           "delta": {"type": "text_delta", "text": p}}) for p in PIECES[1:]),
        *STOP]),
}


@pytest.mark.parametrize("name", STREAMS)
def test_the_words_each_event_adds_are_the_whole_answers_once_each(name):
    dialect_name, events = STREAMS[name]
    completion, added, last = assembled(DIALECTS[dialect_name], events)
    assert last is events[-1]
    assert added == TEXT == checked_text(completion)


def test_a_responses_stream_whose_last_event_holds_no_output_is_read_from_the_items_it_finished():
    _, events = STREAMS["responses-deltas-then-whole"]
    bare = responses_event("response.completed", response={**RESPONSES["responses"], "output": []})
    completion, added, _ = assembled(Responses(), [*events[:-1], bare])
    assert checked_text(completion) == TEXT == added


def test_a_whole_text_that_contradicts_its_deltas_breaks_the_stream_as_malformed():
    events = [responses_event("response.output_text.delta", **AT, delta="Open at 8."),
              responses_event("response.output_text.done", **AT, text=TEXT), COMPLETED]
    with pytest.raises(ProxyError) as caught:
        assembled(Responses(), events)
    assert (caught.value.status, caught.value.code) == (502, "upstream_malformed")


def test_a_chat_answer_whose_content_is_a_list_of_parts_is_read_as_text():
    response = {**RESPONSES["chat"], "choices": [{"index": 0, "finish_reason": "stop", "message": {
        "role": "assistant", "content": [{"type": "text", "text": "The clinic opens "},
                                         {"type": "text", "text": "at 9 am on weekdays."},
                                         {"type": "refusal", "refusal": "No more."}]}}]}
    completion = ChatCompletions().completion(response)
    assert prose(completion) == TEXT and checked_text(completion) == f"{TEXT}\n\nNo more."
    for content in (12, [{"type": "text", "text": 12}], ["text"]):  # not an answer the check can read: a 502
        with pytest.raises(ProxyError) as caught:
            ChatCompletions().completion({**response, "choices": [{"index": 0, "message": {"content": content}}]})
        assert caught.value.status == 502


def test_streamed_calls_are_read_as_a_whole_answers_are_a_custom_tools_input_and_the_legacy_function_call():
    custom = [{"index": 0, "id": "c1", "type": "custom", "custom": {"name": "note", "input": ""}},
              *({"index": 0, "custom": {"input": p}} for p in PIECES)]
    events = [*(chat_chunk({"tool_calls": [call]}) for call in custom),
              chat_chunk({"function_call": {"name": "answer", "arguments": ""}}),
              *(chat_chunk({"function_call": {"arguments": p}}) for p in PIECES), chat_chunk({}, "stop"), DONE]
    completion, added, _ = assembled(ChatCompletions(), events)
    assert added == ""  # calls are no words of the answer: a request that offers tools is buffered
    assert checked_text(completion) == f"{TEXT}\n\n{TEXT}"
    assert message_of(completion)["tool_calls"] == [{"type": "custom", "id": "c1",
                                                     "custom": {"name": "note", "input": TEXT}}]


UNSAID = "Ibuprofen is safe throughout pregnancy."
CALL = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "f", "arguments": '{"a": 1}'}
# Streams whose events carry to the client words or output their last event's answer leaves out: each breaks as a
# malformed reply at that last event, before it (or anything held with it) goes out.
DISAGREEING = {
    "responses-refusal-delta": ("responses", [
        responses_event("response.refusal.delta", **{**AT, "content_index": 1}, delta=UNSAID), COMPLETED]),
    "responses-content-part-added": ("responses", [
        responses_event("response.content_part.added", **{**AT, "content_index": 1},
                        part={**PART, "text": UNSAID}), COMPLETED]),
    "responses-output-item-added": ("responses", [
        responses_event("response.output_item.added", output_index=1,
                        item={**ITEM, "id": "msg_2", "content": [{**PART, "text": UNSAID}]}), COMPLETED]),
    "responses-another-items-delta": ("responses", [
        responses_event("response.output_text.delta", **{**AT, "output_index": 3}, delta=UNSAID), COMPLETED]),
    "responses-function-call-left-out": ("responses", [
        *STREAMS["responses-deltas-then-whole"][1][:-1],
        responses_event("response.output_item.added", output_index=1, item={**CALL, "arguments": ""}),
        responses_event("response.function_call_arguments.delta", output_index=1, item_id="fc_1", delta=CALL[
            "arguments"]),
        responses_event("response.output_item.done", output_index=1, item=CALL), COMPLETED]),
    "messages-text-delta-on-thinking": ("messages", [
        START, event_of("content_block_start", {"type": "content_block_start", "index": 0,
                                                "content_block": {"type": "thinking", "thinking": ""}}),
        event_of("content_block_delta", {"type": "content_block_delta", "index": 0,
                                         "delta": {"type": "text_delta", "text": UNSAID}}), *STOP]),
}


@pytest.mark.parametrize("name", DISAGREEING)
def test_a_stream_whose_last_event_leaves_out_what_its_events_carried_is_malformed(name):
    dialect_name, events = DISAGREEING[name]
    with pytest.raises(ProxyError) as caught:
        assembled(DIALECTS[dialect_name], events)
    assert (caught.value.status, caught.value.code) == (502, "upstream_malformed")


def test_a_function_call_the_response_holds_as_streamed_is_read_with_it():
    done = responses_event("response.completed", response={**RESPONSES["responses"], "output": [ITEM, CALL]})
    _, events = DISAGREEING["responses-function-call-left-out"]
    completion, _, _ = assembled(Responses(), [*events[:-1], done])
    assert message_of(completion)["tool_calls"][0]["function"]["arguments"] == CALL["arguments"]


@pytest.mark.parametrize("choices", [
    [{"index": 0, "delta": {"content": TEXT}}, {"index": 0, "delta": {"content": UNSAID}}],  # the choice twice
    [{"index": 1, "delta": {"content": UNSAID}}]],  # a choice the request (n 1) did not ask for
    ids=["duplicate-index", "unexpected-index"])
def test_a_chat_chunk_with_choices_besides_the_one_asked_for_is_malformed(choices):
    chunk = event_of(None, {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                            "choices": choices})
    with pytest.raises(ProxyError) as caught:
        assembled(ChatCompletions(), [chat_chunk({"content": "The clinic. "}), chunk, chat_chunk({}, "stop"), DONE])
    assert (caught.value.status, caught.value.code) == (502, "upstream_malformed")


def test_a_chat_content_part_the_check_cannot_read_is_named_unreadable_streamed_or_whole():
    part = {"type": "hologram", "text": UNSAID}  # a part of a kind not known here: its words are not read as prose
    completion, _, _ = assembled(ChatCompletions(), [chat_chunk({"content": "The clinic. "}),
                                                    chat_chunk({"content": [part]}), chat_chunk({}, "stop"), DONE])
    assert unreadable(completion) == ["hologram"]
    whole = {**RESPONSES["chat"], "choices": [{"index": 0, "finish_reason": "stop", "message": {
        "role": "assistant", "content": [{"type": "text", "text": TEXT}, part]}}]}
    assert unreadable(ChatCompletions().completion(whole)) == ["hologram"]


def test_a_chat_output_text_part_is_read_as_a_text_part_streamed_or_whole():
    """The Responses API's part type in a chat answer carries the model's words: read, not held unread."""
    part = {"type": "output_text", "text": UNSAID}
    assembly = ChatCompletions().assembly()
    assembly.add(chat_chunk({"content": [part]}))
    assert (assembly.added, assembly.opaque) == (UNSAID, False)  # words a stream checked as it flows reads
    whole = {**RESPONSES["chat"], "choices": [{"index": 0, "finish_reason": "stop", "message": {
        "role": "assistant", "content": [{"type": "text", "text": "The clinic. "}, part]}}]}
    completion = ChatCompletions().completion(whole)
    assert checked_text(completion) == f"The clinic. {UNSAID}" and unreadable(completion) == []


def test_a_responses_transcript_is_read_as_words_and_its_whole_must_match_its_deltas():
    assembly = Responses().assembly()
    assembly.add(responses_event("response.audio.transcript.delta", delta=UNSAID))
    assert (assembly.added, assembly.opaque) == (UNSAID, False)
    events = [responses_event("response.audio.transcript.delta", delta="Open at 8."),
              responses_event("response.audio.transcript.done", transcript=TEXT), COMPLETED]
    with pytest.raises(ProxyError) as caught:
        assembled(Responses(), events)
    assert (caught.value.status, caught.value.code) == (502, "upstream_malformed")
