"""Reading a judge's reply: its judgment (YES, NO, NOT SURE), its one-line reason, and (when the backend
returns log-probabilities) how much the model believed in each judgment. The replies write it under the
JSON key "verdict", the word the prompts ask for.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from morphguard.llm.client import LLMClient, TokenChoice, together
from morphguard.models import Judgment, StageCost

_LEADING_VERDICT = re.compile(r"^\W*(not\s*sure|not_sure|unsure|yes|no)\b[\s.:,\-–]*(.*)$", re.I | re.S)


@dataclass(frozen=True)
class ParsedJudgment:
    judgment: Judgment
    reason: str
    parsed: bool  # False: unreadable reply, counted as NOT SURE


def _normalise(word: str) -> Judgment | None:
    word = re.sub(r"[\s_]+", " ", word.strip().upper())
    return {"YES": Judgment.YES, "NO": Judgment.NO, "NOT SURE": Judgment.NOT_SURE,
            "UNSURE": Judgment.NOT_SURE}.get(word)


def parse_judgment(text: str) -> ParsedJudgment:
    """Accepts the JSON we ask for, or a reply that starts with YES / NO / NOT SURE."""
    stripped = text.strip()
    try:
        data = json.loads(stripped)
    except ValueError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("verdict"), str):
        verdict = _normalise(data["verdict"])
        if verdict is not None:
            return ParsedJudgment(verdict, str(data.get("reason") or "").strip(), True)
    match = _LEADING_VERDICT.match(stripped)
    if match:
        verdict = _normalise(match.group(1))
        if verdict is not None:
            reason = match.group(2).strip()
            return ParsedJudgment(verdict, reason.splitlines()[0] if reason else "", True)
    return ParsedJudgment(Judgment.NOT_SURE, stripped[:200], False)


def _token_judgment(token: str) -> Judgment | None:
    word = token.strip().strip('"').upper()
    if word in {"YES", "YE"}:
        return Judgment.YES
    if word == "NO":
        return Judgment.NO
    if word in {"NOT", "NOT SURE", "UNSURE", "UN"}:
        return Judgment.NOT_SURE
    return None


_VERDICT_KEY = re.compile(r'"verdict"\s*:\s*"')
_LIST_ITEM = re.compile(r'[\[,]\s*"')


def judgment_probabilities(tokens: Sequence[TokenChoice] | None, occurrence: int = 0,
                          listed: bool = False) -> dict[Judgment, float] | None:
    """P(YES), P(NO), P(NOT SURE) at the token where the verdict is written, renormalised over the three.

    The verdict's position is found in the generated tokens (after the `occurrence`-th `"verdict": "`
    in JSON, or, `listed`, the `occurrence`-th string of a JSON list; else at the start); the token that
    covers it carries the alternatives the model weighed there. The tokens, not the reply's text, are
    searched: llama.cpp may generate a ```json fence that its reply content leaves out.
    """
    if not tokens:
        return None
    stream = "".join(choice.token for choice in tokens)
    matches = list((_LIST_ITEM if listed else _VERDICT_KEY).finditer(stream))
    if occurrence and occurrence >= len(matches):
        return None
    position = matches[occurrence].end() if matches else len(stream) - len(stream.lstrip())
    choice = _token_at(tokens, position)
    return _distribution(choice) if choice else None


async def ask_yes_no(llm: LLMClient, messages: list[dict[str, str]], model: str | None, stage: StageCost) -> float:
    """Ask the judge a question it answers with one word, YES or NO, and return its probability of NO against
    YES: from the log-probabilities where the reply has them, else from the word itself (0.5 when it is
    neither). The call is counted on `stage`."""
    if llm.votes > 1 and not llm.abilities(model).logprobs:
        replies = await together(llm.complete(messages, model=model, max_tokens=2, temperature=1.0)
                                 for _ in range(llm.votes))
        for reply in replies:
            stage.count(reply)
        stage.seconds += max(reply.seconds for reply in replies)  # asked at once
        return sum(_said_no(reply.text) for reply in replies) / len(replies)
    reply = await llm.complete(messages, model=model, max_tokens=2, top_logprobs=5)
    stage.count(reply)
    stage.seconds += reply.seconds
    probabilities = judgment_probabilities(reply.logprobs)
    if probabilities and probabilities[Judgment.YES] + probabilities[Judgment.NO] > 0:
        return probabilities[Judgment.NO] / (probabilities[Judgment.YES] + probabilities[Judgment.NO])
    return _said_no(reply.text)


def _said_no(text: str) -> float:
    said = text.strip().upper()
    return 0.0 if said.startswith("YES") else 1.0 if said.startswith("NO") else 0.5


def _token_at(tokens: Sequence[TokenChoice], position: int) -> TokenChoice | None:
    """The first non-blank token that ends after character `position` of the token stream."""
    offset = 0
    for choice in tokens:
        offset += len(choice.token)
        if offset > position and choice.token.strip():
            return choice
    return None


def _distribution(choice: TokenChoice) -> dict[Judgment, float] | None:
    mass: dict[Judgment, float] = {}
    seen: set[str] = set()
    for token, logprob in (*choice.alternatives, (choice.token, choice.logprob)):  # the pick is often listed too
        verdict = _token_judgment(token)
        if verdict is None or token in seen:
            continue
        seen.add(token)
        mass[verdict] = mass.get(verdict, 0.0) + math.exp(logprob)
    total = sum(mass.values())
    if total <= 0:
        return None
    return {v: mass.get(v, 0.0) / total for v in Judgment}


def label_probabilities(tokens: Sequence[TokenChoice] | None, key: str,
                        labels: Sequence[str], occurrence: int = 0) -> dict[str, float] | None:
    """P(label) at the token where the `occurrence`-th JSON value of `key` is written, for labels with distinct
    first letters."""
    if not tokens:
        return None
    found = list(re.finditer(rf'"{re.escape(key)}"\s*:\s*"', "".join(choice.token for choice in tokens)))
    choice = _token_at(tokens, found[occurrence].end()) if occurrence < len(found) else None
    if choice is None:
        return None
    mass: dict[str, float] = {}
    seen: set[str] = set()
    for token, logprob in (*choice.alternatives, (choice.token, choice.logprob)):
        word = token.strip().strip('"').lower()
        label = next((lb for lb in labels if word and lb.startswith(word[:3]) and word[0] == lb[0]), None)
        if label is None or token in seen:
            continue
        seen.add(token)
        mass[label] = mass.get(label, 0.0) + math.exp(logprob)
    total = sum(mass.values())
    return {lb: mass.get(lb, 0.0) / total for lb in labels} if total > 0 else None
