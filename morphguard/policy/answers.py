"""What an answer says, read from every field of a chat completion that carries the model's words.

The check reads the prose (`content`, a string or a list of text parts: `text`, or `output_text` as some servers
write the Responses API's part into a chat answer), a refusal (the message's, or a
refusal part of its content), a spoken answer's transcript and, unless policy says otherwise
(`policy.tool_calls`), the arguments of tool calls: apps that take a structured answer through a tool call
find it there. A streamed chat answer is read by the same functions, a chunk's delta at a time (`said`). The
Responses and Messages dialects translate their outputs into this chat message shape; output they cannot
translate (an image, a computer action) is named under `UNREADABLE`, and `policy.unreadable_output` says what
happens to an answer that carries some.
"""

from __future__ import annotations

from typing import Any

UNREADABLE = "unreadable"  # key of a translated message: the output types the check cannot read
_TEXT_PARTS = ("text", "output_text")  # the content parts whose `text` is the answer's prose
_READ_PARTS = (*_TEXT_PARTS, "refusal")  # the content parts whose words the check reads


def as_completion(message: dict[str, Any]) -> dict[str, Any]:
    """A chat message as the completion the guard reads and rewrites."""
    return {"object": "chat.completion", "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}


def message_of(completion: Any) -> dict[str, Any]:
    """The first choice's message, or an empty one."""
    try:
        message = completion["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        return {}
    return message if isinstance(message, dict) else {}


def content_text(content: Any) -> str:
    """The text of a message's (or a delta's) content: a string, or the `text` of its text parts (`_TEXT_PARTS`),
    joined as they follow each other (a streamed part is a piece of the text, not a paragraph)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content
                       if isinstance(p, dict) and p.get("type") in _TEXT_PARTS and isinstance(p.get("text"), str))
    return ""


def unread_parts(content: Any) -> list[str]:
    """The types of a content's parts the check does not read: any but text and refusal (an image, a part of a kind
    not known here)."""
    if not isinstance(content, list):
        return []
    return [str(p.get("type"))[:40] for p in content if isinstance(p, dict) and p.get("type") not in _READ_PARTS]


def content_refusal(content: Any) -> str:
    """The refusal parts of a content that is a list of parts."""
    if not isinstance(content, list):
        return ""
    return "".join(p["refusal"] for p in content
                   if isinstance(p, dict) and p.get("type") == "refusal" and isinstance(p.get("refusal"), str))


def said(message: dict[str, Any]) -> str:
    """The words of a message or of a streamed delta, tool calls aside: its content's text, its refusal and its
    audio transcript, in that order. A delta's words are what it adds to the answer."""
    audio = message.get("audio")
    parts = [content_text(message.get("content")), content_refusal(message.get("content")), message.get("refusal"),
             audio.get("transcript") if isinstance(audio, dict) else None]
    return "".join(p for p in parts if isinstance(p, str))


def prose(completion: Any) -> str:
    """The answer's text content: what `highlight`, `cite` and `block` rewrite."""
    return content_text(message_of(completion).get("content"))


def tool_arguments(message: dict[str, Any]) -> list[str]:
    """The argument strings of a message's tool calls (and of the legacy `function_call`)."""
    calls = message.get("tool_calls")
    out = []
    for call in calls if isinstance(calls, list) else []:
        if not isinstance(call, dict):
            continue
        function, custom = call.get("function"), call.get("custom")
        if isinstance(function, dict) and isinstance(function.get("arguments"), str):
            out.append(function["arguments"])
        elif isinstance(custom, dict) and isinstance(custom.get("input"), str):
            out.append(custom["input"])
    legacy = message.get("function_call")
    if isinstance(legacy, dict) and isinstance(legacy.get("arguments"), str):
        out.append(legacy["arguments"])
    return out


def has_tool_calls(completion: Any) -> bool:
    message = message_of(completion)
    return bool(message.get("tool_calls")) or isinstance(message.get("function_call"), dict)


def checked_text(completion: Any, *, tool_calls: bool = True) -> str:
    """Everything the check reads, in one text: prose, refusal, transcript, then tool-call arguments.

    The prose comes first, so the spans the check reports within it are offsets into `prose` too."""
    message = message_of(completion)
    audio = message.get("audio")
    parts = [prose(completion), content_refusal(message.get("content")), message.get("refusal"),
             audio.get("transcript") if isinstance(audio, dict) else None]
    if tool_calls:
        parts += tool_arguments(message)
    return "\n\n".join(p for p in parts if isinstance(p, str) and p.strip())


def unreadable(completion: Any) -> list[str]:
    """The parts of the answer the check cannot read (named by type)."""
    message = message_of(completion)
    named = message.get(UNREADABLE)
    out = [str(n) for n in named] if isinstance(named, list) else []
    out += unread_parts(message.get("content"))
    audio = message.get("audio")
    if isinstance(audio, dict) and not (isinstance(audio.get("transcript"), str) and audio["transcript"].strip()):
        out.append("audio")
    return out
