"""The `anthropic` client on the Messages API, streamed and not: a blocked answer ends with
`stop_reason: "refusal"`, the safe message as its text and its explanation; the verdict is the `morphguard`
field of the message (and of the stream's `morphguard.verdict` and `message_stop` events), which the
`.stream()` helper's final message drops: the capture has it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from morphguard.integrations.clients import VerdictCapture, verdict_of
from tests.clients.conftest import HALLUCINATED, QUESTION, SAFE, SYSTEM

if TYPE_CHECKING:
    import anthropic

ASK = {"model": "hallucinated", "max_tokens": 200, "system": SYSTEM,
       "messages": [{"role": "user", "content": QUESTION}]}


def claude(base: str, capture: VerdictCapture | None = None) -> anthropic.Anthropic:
    import anthropic  # here, not with the module (tests/clients/conftest.py says why)
    import httpx2

    http = httpx2.Client(event_hooks=capture.hooks) if capture else None
    return anthropic.Anthropic(base_url=base, api_key="sk-ant-client", max_retries=0, timeout=60, http_client=http)


def test_messages_block_is_a_refusal(block_proxy):
    raw = claude(block_proxy).messages.with_raw_response.create(**ASK)
    message = raw.parse()
    assert message.stop_reason == "refusal" and message.stop_details.explanation == SAFE
    assert [b.text for b in message.content] == [SAFE]
    assert verdict_of(message)["action"] == "block" and raw.headers["x-morphguard-action"] == "block"


def test_messages_annotate_verdict_is_the_body_field(annotate_proxy):
    message = claude(annotate_proxy).messages.create(**ASK)
    assert message.content[0].text == HALLUCINATED and message.stop_reason == "end_turn"
    assert verdict_of(message)["flagged"]


def test_messages_stream_block_events(block_proxy):
    events = list(claude(block_proxy).messages.create(**ASK, stream=True))
    assert [e.type for e in events][-3:] == ["message_delta", "morphguard.verdict", "message_stop"]
    assert "".join(e.delta.text for e in events if e.type == "content_block_delta") == SAFE
    ending = next(e for e in events if e.type == "message_delta")
    assert ending.delta.stop_reason == "refusal" and ending.delta.stop_details.explanation == SAFE
    assert verdict_of(events[-1])["action"] == "block"


def test_messages_stream_helper_block_and_annotate(block_proxy, annotate_proxy):
    capture = VerdictCapture()
    with claude(block_proxy, capture).messages.stream(**ASK) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "refusal" and final.content[0].text == SAFE
    assert final.stop_details.explanation == SAFE
    assert verdict_of(final) is None and capture.last["action"] == "block"  # the helper drops the field
    with claude(annotate_proxy, capture).messages.stream(**ASK) as stream:
        final = stream.get_final_message()
    assert final.content[0].text == HALLUCINATED and capture.last["flagged"]
