"""`morphguard eval --target-recall R` (or `--target-precision P`): thresholds proposed from labelled data.

For the items of each topic (the one recorded with the item, else the one the policy's tagger finds; and
for all items together), the highest threshold that still catches the target share of hallucinated
answers (recall), or the lowest that keeps the target share of flags right (precision). Written as a
`policy.profiles` snippet to paste into the config; a topic with too few labelled answers to say
anything keeps the profile's threshold.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from morphguard.config import PolicySettings
from morphguard.eval.items import Item
from morphguard.eval.runner import Outcome
from morphguard.models import RagInput
from morphguard.policy.topics import TopicTagger

MIN_HALLUCINATED = 5  # fewer labelled errors than this in a topic: no proposal for it


def threshold_for(labels: Sequence[bool], scores: Sequence[float], *, recall: float | None = None,
                  precision: float | None = None) -> float | None:
    """The threshold meeting the target, or None when no threshold does."""
    positives = sum(labels)
    if not positives:
        return None
    candidates = sorted(set(scores), reverse=True)  # from the strictest flag to the loosest
    for tau in candidates:
        flagged = [y for y, s in zip(labels, scores, strict=True) if s >= tau]
        hits = sum(flagged)
        if recall is not None and hits / positives >= recall:
            return tau
    if precision is None:
        return None
    for tau in reversed(candidates):  # the loosest threshold whose flags are right often enough
        flagged = [y for y, s in zip(labels, scores, strict=True) if s >= tau]
        if flagged and sum(flagged) / len(flagged) >= precision:
            return tau
    return None


def propose(items: Sequence[Item], outcomes: Sequence[Outcome], detector: str, policy: PolicySettings, *,
            recall: float | None = None, precision: float | None = None) -> dict[str, Any]:
    scores = {o.item_id: o.score for o in outcomes if o.detector == detector and o.repeat == 0
              and o.error is None and o.score is not None}
    tagger = TopicTagger(policy.topics)
    groups: dict[str, list[tuple[bool, float]]] = defaultdict(list)
    for item in items:
        if item.id not in scores:
            continue
        groups["(all)"].append((item.hallucinated, scores[item.id]))
        topics = [item.topic] if item.topic else tagger.tag(RagInput(question=item.question, passages=item.passages))
        for topic in topics[:1]:
            groups[topic].append((item.hallucinated, scores[item.id]))
    proposals: dict[str, Any] = {}
    for topic, pairs in sorted(groups.items()):
        labels = [y for y, _ in pairs]
        tau = (threshold_for(labels, [s for _, s in pairs], recall=recall, precision=precision)
               if sum(labels) >= MIN_HALLUCINATED else None)
        proposals[topic] = {"threshold": tau, "n": len(pairs), "hallucinated": sum(labels)}
    return proposals


def snippet(proposals: dict[str, Any], detector: str, target: str, profile: str = "general") -> str:
    overall = proposals.get("(all)", {})
    lines = [f"# Proposed by morphguard eval for {detector}, {target}; n = labelled answers, h = hallucinated.",
             "policy:", "  profiles:", f"    {profile}:"]
    if overall.get("threshold") is not None:
        lines.append(f"      threshold: {overall['threshold']:.3f}  # n={overall['n']} h={overall['hallucinated']}")
    topics = {t: p for t, p in proposals.items() if t != "(all)"}
    proposed = {t: p for t, p in topics.items() if p["threshold"] is not None}
    if proposed:
        lines.append("      topics:")
        lines += [f"        {t}: {{threshold: {p['threshold']:.3f}}}  # n={p['n']} h={p['hallucinated']}"
                  for t, p in proposed.items()]
    lines += [f"# {t}: too few labelled errors to propose a threshold (n={p['n']} h={p['hallucinated']})"
              for t, p in topics.items() if t not in proposed]
    return "\n".join(lines)
