"""An answer of several choices (`n > 1`) as one answer per choice, and back; and the legacy text completions API
(`prompt` in, `choices[i].text` out) read as a chat.

The guard reads and rewrites one answer, the first choice's message (`policy.answers`). A gateway that relays a
response of several choices (Portkey's webhook, the LiteLLM guardrail) has each checked as its own answer
(`Guard.settle_choices`), then writes what policy made of each back in its place (`rejoined`).
"""

from __future__ import annotations

from typing import Any

from morphguard.policy.answers import prose
from morphguard.proxy.body import check_content
from morphguard.proxy.context import OUR_FIELD
from morphguard.proxy.errors import bad_request


def text_prompt_chat(body: dict[str, Any], where: str = "prompt") -> dict[str, Any]:
    """A text completion request as a chat: its prompt (a string or strings) as the user's message."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        prompt = "\n".join(prompt)
    if not isinstance(prompt, str):
        raise bad_request(f"'{where}' must be a string or an array of strings.", where)
    view: dict[str, Any] = {k: body[k] for k in ("model", "stream", OUR_FIELD) if k in body}
    return {**view, "messages": [{"role": "user", "content": prompt}]}


def each(response: dict[str, Any], *, text: bool = False, where: str = "choices") -> list[dict[str, Any]]:
    """Each choice of a chat (or, `text`, a text) completion as a chat completion of its own; 400 naming `where`
    for a response whose choices cannot be read."""
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices:
        raise bad_request(f"'{where}' must be a non-empty array.", where)
    out = []
    for i, choice in enumerate(choices):
        at = f"{where}[{i}]"
        if text:
            if not isinstance(choice, dict) or not isinstance(choice.get("text"), str):
                raise bad_request(f"'{at}' must be an object with a 'text' string.", at)
            message: dict[str, Any] = {"role": "assistant", "content": choice["text"]}
        else:
            if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
                raise bad_request(f"'{at}' must be an object with a 'message' object.", at)
            check_content(choice["message"].get("content"), f"{at}.message.content")
            message = choice["message"]
        out.append({**response, "choices": [{**choice, "index": 0, "message": message}]})
    return out


def rejoined(response: dict[str, Any], reviewed: list[dict[str, Any]], *, text: bool = False) -> dict[str, Any]:
    """The response with each choice as policy left it (`reviewed`, one completion per choice, in order)."""
    choices = []
    for original, checked in zip(response["choices"], reviewed, strict=True):
        if text:
            choices.append({**original, "text": prose(checked)})
        else:
            choices.append({**checked["choices"][0], "index": original.get("index")})
    return {**response, "choices": choices}
