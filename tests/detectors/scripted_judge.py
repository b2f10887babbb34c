"""A scripted MetaRAG judge: answers each stage's prompt by rule, so tests control every verdict."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from tests.scripted_llm import completion


def _tag(text: str, tag: str) -> str:
    match = re.search(rf"<{tag}>\n?(.*?)\n?</{tag}>", text, re.S)
    return match.group(1).strip() if match else ""


def stage_of(body: dict[str, Any]) -> str:
    system = body["messages"][0]["content"]
    for marker, stage in (("You check facts. Answer with one word", "probe"),
                          ("strict fact checker", "direct"), ("compare two sentences", "restatement"),
                          ("one sentence of an answer", "spotcheck"),
                          ("atomic factoids", "decompose"),
                          ("paraphrases", "synonym"),
                          ("contradictions", "antonym"), ("reference passages", "verify")):
        if marker in system:
            return stage
    raise AssertionError(f"unknown prompt: {system[:80]}")


def judge(factoids: list[str], verdict: Callable[[str], str], n: int = 2,
          logprobs: Callable[[str], list[dict[str, Any]] | None] = lambda s: None):
    """Decompose into `factoids`; synonyms are 'S<i>: <factoid>', antonyms 'A<i>: <factoid>';
    `verdict(statement)` gives the verifier's raw reply text."""

    def reply(body: dict[str, Any]):
        stage = stage_of(body)
        user = body["messages"][-1]["content"]
        if stage == "probe":  # the start-up probe (detectors/judges.py): a judge that answers
            return json.dumps({"verdict": "YES"}) if body.get("response_format") else "YES"
        if stage == "decompose":
            return json.dumps({"factoids": factoids})
        if stage in ("synonym", "antonym"):
            factoid = _tag(user, "statement")
            prefix = "S" if stage == "synonym" else "A"
            return json.dumps({"statements": [f"{prefix}{i}: {factoid}" for i in range(1, n + 1)]})
        statement = _tag(user, "statement")
        text = verdict(statement)
        return completion(text, logprobs=logprobs(statement))

    return reply


def every_part_says(word: str) -> Callable[[dict[str, Any]], Any]:
    """A judge giving `word` ("YES" or "NO") to every part of the combined check: the probe, `direct` (naming no
    phrase) and the rest."""
    def reply(body: dict[str, Any]) -> Any:
        stage = stage_of(body)
        if stage == "probe":
            return json.dumps({"verdict": word}) if body.get("response_format") else word
        if stage == "direct":
            return json.dumps({"verdict": word, "unsupported": []})
        return completion(word)
    return reply
