"""What an action does to a chat completion. Pure functions over the completion's JSON; the proxy calls them.

`pass` and `annotate` leave the answer as it is (the verdict travels beside it); `highlight` marks the
flagged spans; `cite` appends, for each flagged statement, what the context says about it; `block` swaps
the answer for the safe message; `regenerate` is a loop the proxy runs with `regeneration_body`.

`withheld` is the one place that decides what of a blocked answer a client may see: nothing of it. Every
choice becomes the safe message, with no tool calls, audio or logprobs of the blocked answer, shaped as the
provider's own refusal: the message's `refusal` is the safe message and the choice ends normally (`stop`).
That is what the clients read as a refusal (`parse()` leaves `parsed` empty, LangChain's structured output
and the Agents SDK raise their refusal errors) where a `content_filter` ending makes several of them raise a
protocol error; `content` carries the safe message too, for clients that show only the text.
"""

from __future__ import annotations

import bisect
import copy
import re
from collections.abc import Sequence
from typing import Any

from morphguard.config import PolicySettings
from morphguard.detectors.spans import evidence_for
from morphguard.detectors.text import sentences
from morphguard.models import Decision, Detection, Evidence, Factoid
from morphguard.policy.answers import checked_text, prose


def with_answer(completion: dict[str, Any], text: str) -> dict[str, Any]:
    """The same completion with the first choice's text replaced; its logprobs, which spell the old text, go."""
    out = copy.deepcopy(completion)
    choices = out.get("choices") or [{"index": 0}]
    first = choices[0]
    first["message"] = {**(first.get("message") or {}), "role": "assistant", "content": text}
    if "logprobs" in first:
        first["logprobs"] = None
    out["choices"] = [first, *choices[1:]]
    return out


def withheld(completion: dict[str, Any], safe_message: str) -> dict[str, Any]:
    """A blocked completion: every choice is the safe message alone, as a refusal."""
    out = {k: copy.deepcopy(v) for k, v in completion.items() if k != "choices"}
    choices = completion.get("choices") or [{"index": 0}]
    out["choices"] = [{"index": c.get("index", i) if isinstance(c, dict) else i,
                       "message": {"role": "assistant", "content": safe_message, "refusal": safe_message},
                       "logprobs": None, "finish_reason": "stop"} for i, c in enumerate(choices)]
    return out


def claims(factoids: Sequence[Factoid]) -> list[Factoid]:
    """One factoid per claim: detectors that combine parts can name one sentence once per part, so factoids
    of the same span (or, unplaced, the same words) become one, scored as its most suspicious part scored it,
    carrying the first evidence any part found and every part's reason (a contradiction wins the label).
    Spans that differ only at their edges (one part keeps a sentence's full stop, another drops it) are the
    same span, and the claim takes the longer. Order of first appearance is kept. Linear in the number of
    factoids: an answer can hold thousands."""
    merged: list[Factoid] = []
    starts: dict[int, list[int]] = {}  # where placed claims start -> their places in `merged`
    unplaced: dict[str, int] = {}
    for factoid in factoids:
        at = _same_claim(factoid, merged, starts, unplaced)
        if at is None:
            if factoid.start is None or factoid.end is None:
                unplaced[factoid.text] = len(merged)
            else:
                starts.setdefault(factoid.start, []).append(len(merged))
            merged.append(factoid)
            continue
        seen = merged[at]
        best = factoid if factoid.score > seen.score else seen
        wider = factoid if _length(factoid) > _length(seen) else seen
        reasons = [r for r in dict.fromkeys((seen.reason, factoid.reason)) if r]
        merged[at] = best.model_copy(update={
            "text": wider.text, "start": wider.start, "end": wider.end,
            "evidence": best.evidence or seen.evidence or factoid.evidence, "reason": "; ".join(reasons),
            "label": "contradicted" if "contradicted" in (seen.label, factoid.label) else best.label})
        if wider.start is not None and wider.start != seen.start:
            starts.setdefault(wider.start, []).append(at)
    return merged


def _length(factoid: Factoid) -> int:
    return (factoid.end or 0) - (factoid.start or 0)


def _same_claim(factoid: Factoid, merged: list[Factoid], starts: dict[int, list[int]],
                unplaced: dict[str, int]) -> int | None:
    """The place in `merged` of the claim `factoid` restates: a span sharing 90 % of the longer of the two (a
    sentence and the same sentence less its last character, never a phrase and the sentence around it)."""
    if factoid.start is None or factoid.end is None:
        return unplaced.get(factoid.text)
    length = factoid.end - factoid.start
    reach = int(length / 9) + 1  # 90 % in common puts the two starts at most a tenth of the longer apart
    for start in range(factoid.start - reach, factoid.start + reach + 1):
        for at in starts.get(start, ()):
            seen = merged[at]
            assert seen.start is not None and seen.end is not None
            overlap = min(seen.end, factoid.end) - max(seen.start, factoid.start)
            longer = max(seen.end - seen.start, length)
            if longer > 0 and overlap >= 0.9 * longer:
                return at
    return None


def flagged_factoids(detection: Detection, threshold: float) -> list[Factoid]:
    return [f for f in claims(detection.factoids) if f.score >= threshold]


def highlight(text: str, factoids: Sequence[Factoid], open_mark: str, close_mark: str) -> str:
    """Wrap each flagged factoid's span of the answer in the markers; overlapping spans are merged."""
    spans = sorted((f.start, f.end) for f in factoids if f.start is not None and f.end is not None and f.end > f.start)
    merged: list[list[int]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    out, cursor = [], 0
    for start, end in merged:
        out += [text[cursor:start], open_mark, text[start:end], close_mark]
        cursor = end
    return "".join(out) + text[cursor:]


# The most flagged statements `cite` quotes sources for. Each is looked up over the whole context, and an answer can
# be made to carry thousands of unsupported sentences (4,000 took 54 s to cite, one by one); a reader wants the first
# few, and the verdict lists every one.
MAX_CITATIONS = 20
_WORD = re.compile(r"\w")


def citations(factoids: Sequence[Factoid], passages: Sequence[str], answer: str = "") -> str:
    """For each factoid (the first `MAX_CITATIONS`), the detector's own evidence when it has some, else the
    best-aligned context sentence. A factoid that is a phrase of a sentence of `answer` (its offsets are in it) is
    cited by that sentence: the phrase alone ("in 1999") says too little to find what the context says of it. The
    phrases of one sentence share its line."""
    cited = factoids[:MAX_CITATIONS]
    statements = _statements(cited, answer)
    aligned = iter(evidence_for([text for text, _, evidence in statements if evidence is None], passages))
    lines = ["", "", "Checked against the sources:"]
    for text, phrases, evidence in statements:
        found = evidence or next(aligned)
        named = f'"{text}"' + (" (flagged: " + ", ".join(f'"{p}"' for p in phrases) + ")" if phrases else "")
        if found:
            lines.append(f'- {named}: source [{found.passage}] says "{found.text}"')
        else:
            lines.append(f"- {named}: no retrieved source supports this.")
    if len(factoids) > len(cited):
        lines.append(f"- and {len(factoids) - len(cited)} more flagged statements, listed in the verdict.")
    return "\n".join(lines)


def _statements(factoids: Sequence[Factoid], answer: str) -> list[tuple[str, list[str], Evidence | None]]:
    """What each factoid is cited as, in order: the statement looked up, the phrases of it flagged (none where the
    factoid is the statement itself) and the first evidence a detector gave for it."""
    bounds = sentences(answer) if any(_placed(f, answer) for f in factoids) else []
    out: dict[object, tuple[str, list[str], Evidence | None]] = {}
    for n, factoid in enumerate(factoids):
        evidence = factoid.evidence[0] if factoid.evidence else None
        around = _sentence_around(factoid, answer, bounds)
        if around is None:
            out[n] = (factoid.text, [], evidence)
            continue
        text, phrases, seen = out.get(around, (answer[around[0]:around[1]], [], None))
        out[around] = (text, [*phrases, factoid.text], seen or evidence)
    return list(out.values())


def _placed(factoid: Factoid, answer: str) -> bool:
    return factoid.start is not None and factoid.end is not None and 0 <= factoid.start < factoid.end <= len(answer)


def _sentence_around(factoid: Factoid, answer: str, bounds: list[tuple[int, int]]) -> tuple[int, int] | None:
    """The span of the answer's sentences (`bounds`) a factoid stands in, where it is a phrase of them (they say
    more than it does); None where it is unplaced or the whole statement."""
    if not _placed(factoid, answer):
        return None
    assert factoid.start is not None and factoid.end is not None
    first = bisect.bisect_right(bounds, factoid.start, key=lambda b: b[1])  # the first sentence ending past its start
    last = bisect.bisect_left(bounds, factoid.end, key=lambda b: b[0]) - 1  # the last starting before its end
    if first > last:
        return None
    start, end = min(bounds[first][0], factoid.start), max(bounds[last][1], factoid.end)
    if not (_WORD.search(answer, start, factoid.start) or _WORD.search(answer, factoid.end, end)):
        return None
    return start, end


def changes(decision: Decision, detection: Detection | None) -> bool:
    """Whether `apply` changes the completion; where it does not, it returns the completion as it is."""
    return decision.action == "block" or detection is not None and decision.action in ("highlight", "cite")


def apply(completion: dict[str, Any], decision: Decision, detection: Detection | None, passages: Sequence[str],
          settings: PolicySettings) -> dict[str, Any]:
    """The completion as the client should see it after `decision.action` (regenerate already carried out)."""
    if not changes(decision, detection):
        return completion
    if decision.action == "block":
        return withheld(completion, decision.safe_message)
    assert detection is not None
    flagged = flagged_factoids(detection, decision.threshold)
    text = prose(completion)
    if decision.action == "highlight":  # marks go in the prose; a claim in a tool call is named in the verdict
        in_prose = [f for f in flagged if f.end is not None and f.end <= len(text)]
        return with_answer(completion, highlight(text, in_prose, settings.highlight.open, settings.highlight.close))
    checked = checked_text(completion, tool_calls=settings.tool_calls == "check")  # where the offsets point
    return with_answer(completion, text + citations(flagged, passages, checked))


def regeneration_body(body: dict[str, Any], detection: Detection, threshold: float,
                      settings: PolicySettings) -> dict[str, Any]:
    """The original request plus one system message naming the unsupported statements."""
    claims = "; ".join(f'"{f.text}"' for f in flagged_factoids(detection, threshold)) or "(unspecified)"
    instruction = settings.regenerate.instruction.replace("{claims}", claims)
    retry = {k: v for k, v in body.items() if k not in ("stream", "stream_options", "n")}
    retry["messages"] = [*body.get("messages", []), {"role": "system", "content": instruction}]
    return retry
