"""Policy's one decision on an answer, and the choice of profile and topic it is made under.

`PolicyEngine.decide` turns what the check found (`Finding`: a detection, a failed check, or none made), what
the answer holds beside its text (`Holds`: parts the check cannot read, tool calls) and what the answer's way out
can still change (`Reach`) into one `Decision`. Nothing after it changes the action: the guard carries it out.

Several topics can match one request; the strictest rule among them applies (lowest threshold, then the
strongest action), so a question about pregnancy and employment gets the care of the stricter one. A request
no topic matches gets the topic "general": its profile's own threshold and action.

Routes compare what a client can spell several ways in one form: model patterns match the model name
normalised (`morphguard.folding.model_names`: NFKC, case folded, with and without a provider prefix), so
`GPT-4o` and `openai/gpt-4o` are the `gpt-4*` they ask for; the key is the one the provider authenticates the
request by, `Authorization` read with the scheme in any case (the proxy's `credentials.presented_key`).

A route's models match the model a provider is asked for, never a model a caller merely names: a check of an answer
the caller already has (`/v1/check`) carries a free-form label, and a label must not choose a looser profile, so a
route with `models` does not match such a check (`RequestFacts.model_named`).
"""

from __future__ import annotations

import hmac
import logging
import re
from dataclasses import dataclass, field
from enum import Enum
from fnmatch import fnmatchcase

from morphguard.config import Action, OnError, PolicySettings, RouteRule
from morphguard.folding import model_name, model_names, warm
from morphguard.models import Decision, Detection, RagInput
from morphguard.policy.topics import TopicTagger

log = logging.getLogger(__name__)

ACTIONS: tuple[Action, ...] = ("pass", "annotate", "highlight", "cite", "regenerate", "block")  # weakest first
GENERAL = "general"
NO_CONTEXT = "no_context"  # nothing to check the answer against: what it holds is not noted either
# Actions that end an answer: where they apply, an answer the check cannot decide on is withheld unless the rule says
# `on_error: fail_open`.
ENDS_ANSWER = frozenset({"block", "regenerate"})
# Actions that change what the client receives: an answer already sent can only be annotated.
_CHANGES_CONTENT = frozenset({"highlight", "cite", "regenerate", "block"})


def changes_answer(action: Action) -> bool:
    """Whether a rule's action can change what the client receives (more than annotate it): the one answer to that,
    for the engine (what an answer already sent can carry) and for choosing how a stream is checked."""
    return action in _CHANGES_CONTENT


_NAME = re.compile(r"[^\w.-]+")


@dataclass(frozen=True)
class Rule:
    threshold: float
    action: Action
    escalate: bool
    safe_message: str
    on_error: OnError


@dataclass
class RequestFacts:
    """What routing may look at. Header names are lower case."""

    api_key: str | None = None
    model: str | None = None
    model_named: bool = False  # `model` is only the caller's word for who wrote an answer: routes' models ignore it
    headers: dict[str, str] = field(default_factory=dict)
    path_prefix: str = ""
    requested_profile: str | None = None
    requested_topic: str | None = None
    address: str | None = None  # where the request came from (no route reads it: who is asking, for fair turns)


@dataclass(frozen=True)
class Finding:
    """What the check made of an answer's text: a detection, or the short code of a check that failed (`failed`:
    `on_error` decides), or why none was made (`skipped`: no_context, no_answer). Both a detection and `failed`: the
    check read the answer up to a cap (`Detection.unchecked_from`); a flag in what it read decides, else `on_error`
    decides on the rest."""

    detection: Detection | None = None
    failed: str | None = None
    skipped: str | None = None


@dataclass(frozen=True)
class Holds:
    """What an answer holds beside the text the check reads: the parts it cannot read (by type: an image, audio
    with no transcript, an output item it does not know) and whether it calls tools."""

    unreadable: tuple[str, ...] = ()
    tool_calls: bool = False


class Reach(Enum):
    """What the answer's way to the client can still change when policy decides."""

    ASK_AGAIN = "ask_again"  # nothing has gone out and the API can be asked again: every action
    REWRITE = "rewrite"  # nothing has gone out: every action but asking again (`regenerate` withholds)
    WITHHOLD = "withhold"  # a stream checked as it flows: what is still held can be withheld, nothing rewritten
    NONE = "none"  # the answer has gone out: annotating only


def flags(decision: Decision, detection: Detection) -> bool:
    """Whether another answer to the same request (a regeneration) scores past the threshold `decision` applied."""
    return detection.score >= decision.threshold


def _clean(name: str | None) -> str | None:
    """A client-given name reduced to a short, safe label for logs, spans and the audit trail."""
    if not isinstance(name, str):
        return None
    cleaned = _NAME.sub("-", name.strip().lower())[:64].strip("-")
    return cleaned or None


class PolicyEngine:
    def __init__(self, settings: PolicySettings) -> None:
        self.settings = settings
        self.tagger = TopicTagger(settings.topics)
        self._routes = [(route, [model_name(m) for m in route.models]) for route in settings.routes]
        if settings.topic_scan_chars is not None:
            log.warning("policy.topic_scan_chars no longer limits what the topic tagger reads: it reads the whole "
                        "conversation and context (a keyword past a limit went untagged); remove the setting")
        warm()  # the folding tables, now rather than on the first request

    def profile_for(self, facts: RequestFacts) -> str:
        requested = _clean(facts.requested_profile)
        if self.settings.request_override and requested in self.settings.profiles:
            return requested
        for route, models in self._routes:
            if self._matches(route, models, facts):
                return route.profile
        return self.settings.default_profile

    @staticmethod
    def _matches(route: RouteRule, models: list[str], facts: RequestFacts) -> bool:
        if route.api_keys and not (facts.api_key and any(
                hmac.compare_digest(facts.api_key.encode(), k.get_secret_value().encode()) for k in route.api_keys)):
            return False
        if models and (facts.model_named or not facts.model or not any(
                fnmatchcase(name, pattern) for name in model_names(facts.model) for pattern in models)):
            return False
        if any(facts.headers.get(name.lower()) != value for name, value in route.headers.items()):
            return False
        if route.path_prefix is not None and facts.path_prefix.rstrip("/") != route.path_prefix.rstrip("/"):
            return False
        return True

    def rule(self, profile: str, topic: str) -> Rule:
        p = self.settings.profiles[profile]
        t = p.topics.get(topic)
        action = t.action if t and t.action else p.action
        return Rule(
            threshold=t.threshold if t and t.threshold is not None else p.threshold,
            action=action,
            escalate=t.escalate if t and t.escalate is not None else p.escalate,
            safe_message=(t and t.safe_message) or p.safe_message or self.settings.safe_message,
            on_error=(t and t.on_error) or p.on_error or ("fail_closed" if action in ENDS_ANSWER else "fail_open"),
        )

    def topic_for(self, profile: str, rag: RagInput | None, requested: str | None = None) -> str:
        """The strictest of the tagged topics. A topic the request names counts only if it is configured,
        and only as one more candidate (it can make policy stricter, never looser) unless
        `request_override` lets it decide."""
        candidates = self.tagger.tag(rag) if rag else []
        explicit = _clean(requested)
        if explicit is not None and explicit in self.settings.topics:
            if self.settings.request_override:
                return explicit
            candidates.append(explicit)
        if not candidates:
            return GENERAL
        return min(candidates, key=lambda t: (self.rule(profile, t).threshold,
                                              -ACTIONS.index(self.rule(profile, t).action)))

    def decide(self, profile: str, topic: str, finding: Finding, holds: Holds = Holds(),
                reach: Reach = Reach.REWRITE) -> Decision:
        """The one decision on an answer: the rule of its profile and topic applied to what the check found (a
        failed check as `on_error` says), what the check could not read noted (and blocked where `unreadable_output`
        says so), then the action the answer's way out can carry; an answer a failed check lets out is `unchecked`."""
        rule = self.rule(profile, topic)
        decision = Decision(profile=profile, topic=topic, threshold=rule.threshold, flagged=False, action="pass",
                            safe_message=rule.safe_message, reason=finding.skipped)
        if finding.detection is not None:
            flagged = finding.detection.score >= rule.threshold
            decision = decision.model_copy(update={"flagged": flagged, "action": rule.action if flagged else "pass",
                                                   "escalate": flagged and rule.escalate})
        if finding.failed is not None and not decision.flagged:  # nothing checked, or an unchecked rest
            closed = rule.on_error == "fail_closed"
            decision = decision.model_copy(update={"action": "block" if closed else "pass", "escalate": rule.escalate,
                                                   "reason": f"{rule.on_error}: {finding.failed}"})
        elif finding.failed is not None:  # flagged in what it read: the rule decides, the unread rest is noted
            decision = decision.model_copy(update={"reason": f"read in part: {finding.failed}"})
        if finding.skipped != NO_CONTEXT:
            decision = self._noted(decision, holds)
        decision = _within(decision, reach)
        if finding.failed is not None and decision.action != "block":
            decision = decision.model_copy(update={"unchecked": True})
        return decision

    def _noted(self, decision: Decision, holds: Holds) -> Decision:
        """What the check did not read, noted for the audit row, and withheld where policy says so."""
        if holds.unreadable:
            note = "unreadable_output: " + ", ".join(sorted(set(holds.unreadable)))
            if self.settings.unreadable_output == "block":
                decision = decision.model_copy(update={"action": "block", "escalate": False})
        elif holds.tool_calls and self.settings.tool_calls == "record":
            note = "tool_calls_unchecked"
        else:
            return decision
        return decision.model_copy(update={"reason": f"{decision.reason}; {note}" if decision.reason else note})

    def strongest(self, profile: str, topic: str) -> Action:
        """The strongest action policy may take on this request's answers: its rule's, or `block` where
        unreadable output is withheld."""
        action = self.rule(profile, topic).action
        return "block" if self.settings.unreadable_output == "block" else action

    def budget_s(self, profile: str) -> float | None:
        return self.settings.profiles[profile].latency_budget_s


def _within(decision: Decision, reach: Reach) -> Decision:
    """The decision with the action the answer's way out can carry: an answer already sent can only be annotated;
    where the API cannot be asked again, or the stream has partly gone out, `regenerate` withholds instead."""
    action = decision.action
    if changes_answer(action) and (reach is Reach.NONE or reach is Reach.WITHHOLD and action != "block"
                                       and action != "regenerate"):
        return decision.model_copy(update={"action": "annotate",
                                           "reason": f"{action} not possible: the answer was already sent"})
    if action == "regenerate" and reach is Reach.REWRITE:
        return decision.model_copy(update={"action": "block", "reason": "regenerate not possible on this API: blocked"})
    if action == "regenerate" and reach is Reach.WITHHOLD:
        return decision.model_copy(update={"action": "block", "reason": "regenerate not possible mid-stream: blocked"})
    return decision
