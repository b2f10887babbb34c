"""POST /v1/responses (OpenAI's Responses API) in its own shape.

The request goes upstream as the client sent it (less our field); for the check, `instructions` become a system
message, input items messages, function outputs and file-search results tool messages. The answer is read from
every output item that carries the model's words; a stream's from its events, each text or refusal part's words
counted once, whether they came in deltas or whole in the event that opens or closes the part or its item; a spoken
answer's from its transcript's events, which the response does not hold (the check reads it as chat's). A
blocked answer is written as the provider writes its own refusals (a completed response whose one message is a
`refusal` part), with ids the provider never issued. A stream's last event (`response.completed`, `.incomplete` or
`.failed`) is held back until the verdict event has gone out, and carries the verdict too.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator, Sequence
from typing import Any

from morphguard.proxy.context import OUR_FIELD
from morphguard.proxy.dialects.base import (
    Event,
    EventDialect,
    chat_message,
    chat_request,
    event_of,
    text_of,
)
from morphguard.proxy.errors import bad_request, upstream_malformed

# Output that is not the model's answer to the user (its reasoning, the provider's own tool runs): not read.
_NOT_ANSWERS = frozenset({"reasoning", "file_search_call", "web_search_call"})


class Responses(EventDialect):
    """POST /v1/responses (OpenAI)."""

    name = "responses"
    provider: str | None = None
    can_reask = False
    via_litellm = False
    EMPTY: dict[str, Any] = {"object": "response", "output": []}

    @classmethod
    def refused_ending(cls, sent: Sequence[Event], text: str) -> list[Event]:
        """The refusal as the provider streams one: the open text part closed, a `refusal` part (in the open
        message, else in a new one), and `response.completed` whose response is that refusal alone (a partial
        text part would not parse as the client's `text_format`)."""
        response: dict[str, Any] = dict(cls.EMPTY)
        seq, items, parts = 0, 0, 0
        opened: list[tuple[dict[str, Any], dict[str, Any]]] = []  # the open message's parts: where, and as added
        message: dict[str, Any] | None = None
        open_text: dict[str, Any] | None = None
        said: dict[Any, list[str]] = {}
        for ev in sent:
            data = ev.json()
            if not isinstance(data, dict):
                continue
            cls.added(ev, said)
            seq = max(seq, data["sequence_number"] if isinstance(data.get("sequence_number"), int) else 0)
            item: dict[str, Any] = data["item"] if isinstance(data.get("item"), dict) else {}
            part: dict[str, Any] = data["part"] if isinstance(data.get("part"), dict) else {}
            if ev.name == "response.created" and isinstance(data.get("response"), dict):
                response = data["response"]
            elif ev.name == "response.output_item.added":
                items += 1
                message = {**item, "content": []} if item.get("type") == "message" else None
                parts, opened = 0, []
            elif ev.name == "response.output_item.done":
                message = None
            elif ev.name == "response.content_part.added" and message is not None:
                parts += 1
                opened.append((_place(data), part))
                open_text = {"at": _place(data)} if part.get("type") == "output_text" else None
            elif ev.name == "response.content_part.done":
                open_text = None

        def event(name: str, **fields: Any) -> Event:
            nonlocal seq
            seq += 1
            return event_of(name, {"type": name, "sequence_number": seq, **fields})

        out = []
        if open_text is not None:  # no `output_text.done`: the SDK would parse the partial text
            so_far = "".join(said.get(_part_key(open_text["at"], open_text["at"].get("content_index")), []))
            out.append(event("response.content_part.done", **open_text["at"],
                             part={"type": "output_text", "text": so_far, "annotations": []}))
        if message is None:
            message = {"type": "message", "id": f"msg_blocked_{secrets.token_hex(12)}", "role": "assistant",
                       "status": "in_progress", "content": []}
            out.append(event("response.output_item.added", output_index=items, item=message))
            items, parts = items + 1, 0
        at = {"item_id": message.get("id"), "output_index": items - 1, "content_index": parts}
        refusal = {"type": "refusal", "refusal": text}
        # the item as its events made it (its parts with the words they carried, then the refusal); the response
        # holds the refusal alone
        streamed = [_with_words(p, "".join(said.get(_part_key(at, at.get("content_index")), []))) for at, p in opened]
        item = {**message, "status": "completed", "content": [*streamed, refusal]}
        final = {**item, "content": [refusal]}
        out += [event("response.content_part.added", **at, part={"type": "refusal", "refusal": ""}),
                event("response.refusal.delta", **at, delta=text),
                event("response.refusal.done", **at, refusal=text),
                event("response.content_part.done", **at, part=refusal),
                event("response.output_item.done", output_index=items - 1, item=item),
                event("response.completed", response={**response, "status": "completed", "output": [final],
                                                      "incomplete_details": None})]
        return out

    @staticmethod
    def chat_view(body: dict[str, Any]) -> dict[str, Any]:
        messages: list[dict[str, Any]] = []
        if "instructions" in body and body["instructions"] is not None:
            if not isinstance(body["instructions"], str):
                raise bad_request("'instructions' must be a string.", "instructions")
            messages.append({"role": "system", "content": body["instructions"]})
        items = body.get("input")
        if isinstance(items, str):
            items = [{"role": "user", "content": items}]
        if not isinstance(items, list):
            raise bad_request("Missing required parameter: 'input' (a string or an array of items).", "input")
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise bad_request(f"input[{i}] must be an object.", f"input[{i}]")
            kind = item.get("type", "message")
            if kind == "message" and isinstance(item.get("role"), str):
                messages.append({"role": item["role"],
                                 "content": text_of(item.get("content"), ("input_text", "output_text", "text"))})
            elif kind == "function_call_output" and isinstance(item.get("output"), str):
                messages.append({"role": "tool", "content": item["output"]})
            elif kind == "file_search_call" and isinstance(item.get("results"), list):
                messages += [{"role": "tool", "content": r["text"]} for r in item["results"]
                             if isinstance(r, dict) and isinstance(r.get("text"), str)]
        return chat_request(body, messages)

    @staticmethod
    def answer(response: Any) -> dict[str, Any]:
        """The response's output as a chat message (`policy.answers`): text, refusals, tool calls, and the
        output types the check cannot read."""
        output = response.get("output") if isinstance(response, dict) else None
        if not isinstance(output, list):
            raise upstream_malformed("not a response with an output array")
        text, refusals, calls, unread = [], [], [], []
        for item in output:
            kind = item.get("type") if isinstance(item, dict) else None
            if kind == "message":
                for part in item.get("content") or []:
                    part = part if isinstance(part, dict) else {}
                    if part.get("type") == "output_text" and isinstance(part.get("text"), str):
                        text.append(part["text"])
                    elif part.get("type") == "refusal" and isinstance(part.get("refusal"), str):
                        refusals.append(part["refusal"])
            elif kind == "function_call" and isinstance(item.get("arguments"), str):
                function = {"name": item.get("name"), "arguments": item["arguments"]}
                calls.append({"type": "function", "function": function})
            elif kind == "custom_tool_call" and isinstance(item.get("input"), str):
                calls.append({"type": "custom", "custom": {"name": item.get("name"), "input": item["input"]}})
            elif kind not in _NOT_ANSWERS:
                unread.append(str(kind))
        return chat_message("".join(text), refusals, calls, unread)

    @staticmethod
    def rewrite(response: dict[str, Any], text: str, blocked: bool) -> dict[str, Any]:
        """The answer's text replaced (all of it in the first text part), or, blocked, the answer as the
        provider writes its own refusals: a completed response whose one message is a `refusal` part."""
        out = dict(response)
        if blocked:
            # Ids the provider never issued: a later request cannot name the stored blocked response
            # (`previous_response_id`) or its message (`item_reference`) to have it repeated.
            out["id"] = f"resp_blocked_{secrets.token_hex(12)}"
            item = {"type": "message", "id": f"msg_blocked_{secrets.token_hex(12)}",
                    "role": "assistant", "status": "completed",
                    "content": [{"type": "refusal", "refusal": text}]}
            out["output"] = [item]
            out["status"] = "completed"
            out["incomplete_details"] = None
            return out
        first = True
        rebuilt = []
        for item in out.get("output", []):
            if isinstance(item, dict) and item.get("type") == "message":
                parts: list[Any] = []
                for part in item.get("content") or []:
                    if isinstance(part, dict) and part.get("type") == "output_text":
                        if first:
                            parts.append({**part, "text": text, "annotations": []})
                            first = False
                        continue
                    parts.append(part)
                item = {**item, "content": parts}
            rebuilt.append(item)
        out["output"] = rebuilt
        return out

    @staticmethod
    def added(event: Event, said: dict[Any, list[str]]) -> str:
        """The words of a text or refusal part this event adds: a delta's, or, where an event carries the part
        whole (`*.done`, `content_part.*`, `output_item.*`), what no event before it said."""
        name = event.name or ""
        if not name.startswith("response.") or name in _NO_WORDS:
            return ""
        data = event.json()
        if not isinstance(data, dict):
            return ""
        if name in _DELTAS:
            words = data.get("delta")
            if not isinstance(words, str):
                return ""
            key = _TRANSCRIPT if name == _TRANSCRIPT_DELTA else _part_key(data, data.get("content_index"))
            said.setdefault(key, []).append(words)
            return words
        whole: list[tuple[Any, Any]] = []  # (the part's key, its words)
        if name == "response.audio.transcript.done":
            whole.append((_TRANSCRIPT, data.get("transcript")))
        elif name in ("response.output_text.done", "response.refusal.done"):
            whole.append((_part_key(data, data.get("content_index")), data.get("text", data.get("refusal"))))
        elif name in ("response.content_part.added", "response.content_part.done"):
            whole.append((_part_key(data, data.get("content_index")), _part_words(data.get("part"))))
        elif name in ("response.output_item.added", "response.output_item.done"):
            item = data.get("item")
            if isinstance(item, dict) and item.get("type") == "message" and isinstance(item.get("content"), list):
                whole += [(_part_key(data, i), _part_words(part)) for i, part in enumerate(item["content"])]
        return "".join(_unsaid(said, key, words) for key, words in whole if isinstance(words, str) and words)

    @staticmethod
    def is_last(event: Event) -> bool:
        return event.name in ("response.completed", "response.incomplete", "response.failed")

    @staticmethod
    def opaque(event: Event) -> bool:
        """Whether the event carries output other than a message's text and refusal parts (a function call's
        arguments, an image, an item or event of a kind not known here); the events of the response's own framing,
        of a message's text, and of output that is not the answer (reasoning, the provider's searches) do not."""
        name = event.name or ""
        if name in _FRAMING or name.startswith(_NOT_ANSWER_EVENTS):
            return False
        if name in _TEXT_EVENTS:
            return False
        data = event.json()
        if not isinstance(data, dict):
            return True
        if name in ("response.output_item.added", "response.output_item.done"):
            item = data.get("item")
            kind = item.get("type") if isinstance(item, dict) else None
            if kind in _NOT_ANSWERS:
                return False
            return kind != "message" or isinstance(item, dict) and any(_part_words(p) is None
                                                                        for p in item.get("content") or [])
        if name in ("response.content_part.added", "response.content_part.done"):
            return _part_words(data.get("part")) is None
        return True

    @staticmethod
    def collected(events: list[Event]) -> dict[str, Any] | None:
        """The whole response, as the stream's last event carries it; where that response holds no output, with
        the items the stream finished (`response.output_item.done`), which are what the client read."""
        data = events[-1].json() if events else None
        response = data.get("response") if isinstance(data, dict) else None
        if not isinstance(response, dict):
            return None
        if not response.get("output"):
            done = [e.json() for e in events if e.name == "response.output_item.done"]
            items = [d["item"] for d in done if isinstance(d, dict) and isinstance(d.get("item"), dict)]
            if items:
                return {**response, "output": items}
        return response

    @classmethod
    def disagrees(cls, events: list[Event], said: dict[Any, list[str]], text: str) -> str | None:
        """The response's text and refusal parts against the words the events carried to each part, and its output
        against every item the events opened or finished that is not a message: an item the response leaves out,
        or holds otherwise, went to the client unread."""
        response = cls.collected(events)
        output = response.get("output") if isinstance(response, dict) else None
        if not isinstance(output, list):  # no response: the check reads the words the events carried
            return None
        held = {(i, j): words for i, item in enumerate(output) if isinstance(item, dict) and item.get("type") ==
                "message" and isinstance(item.get("content"), list) for j, words in
                enumerate(_part_words(part) for part in item["content"]) if isinstance(words, str) and words}
        if {key: "".join(pieces) for key, pieces in said.items() if any(pieces) and key != _TRANSCRIPT} != held:
            return "the response's text is not the text its events carried"
        for event in events:
            if event.name not in ("response.output_item.added", "response.output_item.done"):
                continue
            data = event.json()
            item = data.get("item") if isinstance(data, dict) else None
            if not isinstance(item, dict) or item.get("type") in _NOT_ANSWERS or item.get("type") == "message":
                continue
            at = data.get("output_index")
            final = output[at] if isinstance(at, int) and 0 <= at < len(output) else None
            if not isinstance(final, dict) or any(final.get(k) != item.get(k) for k in ("type", "id")) \
                    or event.name == "response.output_item.done" and final != item:
                return f"an output item ({str(item.get('type'))[:40]}) the response holds otherwise or not at all"
        return None

    @staticmethod
    def transcript(said: dict[Any, list[str]]) -> str:
        return "".join(said.get(_TRANSCRIPT, ()))

    @staticmethod
    def attach(event: Event, verdict: dict[str, Any]) -> Event:
        """The event with the verdict in the response it carries."""
        data = event.json()
        if isinstance(data, dict) and isinstance(data.get("response"), dict):
            data["response"][OUR_FIELD] = verdict
            return Event(event.name, json.dumps(data))
        return event

    @staticmethod
    def synthesize(response: dict[str, Any]) -> Iterator[Event]:
        """A stream that says what `response` says: the events the SDK assembles into it."""
        seq = 0

        def event(name: str, **data: Any) -> Event:
            nonlocal seq
            seq += 1
            return event_of(name, {"type": name, "sequence_number": seq, **data})

        final = "response.incomplete" if response.get("status") == "incomplete" else "response.completed"
        yield event("response.created", response={**response, "status": "in_progress", "output": []})
        for index, item in enumerate(response.get("output", [])):
            yield event("response.output_item.added", output_index=index, item={**item, "content": []})
            for part_index, part in enumerate(item.get("content") or []):
                at = {"output_index": index, "item_id": item.get("id"), "content_index": part_index}
                # a part opens empty and its words follow as deltas, which clients add up
                if part.get("type") == "output_text":
                    yield event("response.content_part.added", **at, part={**part, "text": ""})
                    yield event("response.output_text.delta", **at, delta=part["text"], logprobs=[])
                    yield event("response.output_text.done", **at, text=part["text"], logprobs=[])
                elif part.get("type") == "refusal":
                    yield event("response.content_part.added", **at, part={**part, "refusal": ""})
                    yield event("response.refusal.delta", **at, delta=part["refusal"])
                    yield event("response.refusal.done", **at, refusal=part["refusal"])
                else:
                    yield event("response.content_part.added", **at, part=part)
                yield event("response.content_part.done", **at, part=part)
            yield event("response.output_item.done", output_index=index, item=item)
        yield event(final, response=response)



# Events that never carry the answer's words: not parsed for them.
_NO_WORDS = frozenset({"response.created", "response.in_progress", "response.completed", "response.incomplete",
                       "response.failed", "response.function_call_arguments.delta",
                       "response.function_call_arguments.done"})


# Events that frame the response, or carry a message's text (read by `added`), or output that is not the answer.
_FRAMING = frozenset({"response.created", "response.in_progress", "response.queued"})
_TEXT_EVENTS = frozenset({"response.output_text.delta", "response.output_text.done", "response.refusal.delta",
                          "response.refusal.done", "response.output_text.annotation.added",
                          "response.audio.transcript.delta", "response.audio.transcript.done"})
_TRANSCRIPT_DELTA = "response.audio.transcript.delta"
_DELTAS = frozenset({"response.output_text.delta", "response.refusal.delta", _TRANSCRIPT_DELTA})
_TRANSCRIPT = ("audio", "transcript")  # where a spoken answer's words are kept among the parts' (`said`)
_NOT_ANSWER_EVENTS = ("response.reasoning", "response.file_search_call.", "response.web_search_call.")


def _part_key(data: dict[str, Any], content_index: Any) -> tuple[Any, Any]:
    """A text or refusal part, as every event about it names it: its item's place in the output, its own in the
    item's content."""
    return data.get("output_index"), content_index


def _part_words(part: Any) -> Any:
    """A part's words: an output text's text, a refusal's refusal (None for any other part)."""
    if not isinstance(part, dict):
        return None
    kind = part.get("type")
    return part.get("text") if kind == "output_text" else part.get("refusal") if kind == "refusal" else None


def _unsaid(said: dict[Any, list[str]], key: Any, words: str) -> str:
    """What of a part's whole `words` was not said before: all of it when no delta carried it, the rest when the
    deltas carried its start. A whole that says something else than the deltas did is a malformed stream: the
    client has both."""
    before = "".join(said.get(key, ()))
    if not words.startswith(before):
        raise upstream_malformed("a text part's whole is not the text its deltas carried")
    said[key] = [words]
    return words[len(before):]


def _with_words(part: dict[str, Any], words: str) -> dict[str, Any]:
    """A text or refusal part holding `words`; any other part as it is."""
    kind = part.get("type")
    return {**part, "text": words} if kind == "output_text" else {**part, "refusal": words} if kind == "refusal" \
        else part


def _place(data: dict[str, Any]) -> dict[str, Any]:
    return {key: data.get(key) for key in ("item_id", "output_index", "content_index")}
