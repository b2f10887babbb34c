"""From a detection to a decision: the route's profile, the request's topic, that topic's threshold and action.

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
from fnmatch import fnmatchcase

from morphguard.config import Action, PolicySettings, RouteRule
from morphguard.folding import model_name, model_names, warm
from morphguard.models import Decision, Detection, RagInput
from morphguard.policy.topics import TopicTagger

log = logging.getLogger(__name__)

ACTIONS: tuple[Action, ...] = ("pass", "annotate", "highlight", "cite", "regenerate", "block")  # weakest first
GENERAL = "general"
_NAME = re.compile(r"[^\w.-]+")


@dataclass(frozen=True)
class Rule:
    threshold: float
    action: Action
    escalate: bool
    safe_message: str


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
        return Rule(
            threshold=t.threshold if t and t.threshold is not None else p.threshold,
            action=t.action if t and t.action else p.action,
            escalate=t.escalate if t and t.escalate is not None else p.escalate,
            safe_message=(t and t.safe_message) or p.safe_message or self.settings.safe_message,
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

    def decide(self, profile: str, topic: str, detection: Detection) -> Decision:
        rule = self.rule(profile, topic)
        flagged = detection.score >= rule.threshold
        return Decision(profile=profile, topic=topic, threshold=rule.threshold, flagged=flagged,
                        action=rule.action if flagged else "pass", escalate=flagged and rule.escalate,
                        safe_message=rule.safe_message)

    def failed(self, profile: str, topic: str, reason: str) -> Decision:
        """The check could not be made (error, timeout): fail open (pass unchecked) or closed (block)."""
        rule = self.rule(profile, topic)
        mode = self.settings.profiles[profile].on_error
        return Decision(profile=profile, topic=topic, threshold=rule.threshold, flagged=False,
                        action="pass" if mode == "fail_open" else "block", escalate=rule.escalate,
                        safe_message=rule.safe_message, reason=f"{mode}: {reason}")

    def unchecked(self, profile: str, topic: str, reason: str) -> Decision:
        rule = self.rule(profile, topic)
        return Decision(profile=profile, topic=topic, threshold=rule.threshold, flagged=False, action="pass",
                        safe_message=rule.safe_message, reason=reason)

    def budget_s(self, profile: str) -> float | None:
        return self.settings.profiles[profile].latency_budget_s
