"""Metric label values, each from a bounded set: a configured value, or OTHER.

Every distinct combination of label values is a series the SDK keeps for the life of the process and the
Prometheus exporter writes on every scrape. A label a client writes (the model it names, a profile or topic
it asks for, a path prefix) or a provider answers with (a response model, an HTTP status) would let anyone
grow them without bound: 3,000 made-up model names made /metrics 22 MB in 68,000 series, each scrape held
the event loop for a second, and the page echoed the clients' strings. So the metric helpers in
`morphguard.telemetry` pass every such label through here:

- model: the first configured glob its normalised name matches (`telemetry.metric_models`, then the models
  of `policy.routes`, then the `proxy.litellm_routes` prefixes), as configured; else OTHER;
- topic and profile: a configured one (or "general", the topic of an untagged request); else OTHER;
- action and detector: the config's actions and the registered detectors; else OTHER;
- error.type: a standard HTTP status or an exception class's name (both come from code, not from clients);
- reason: the proxy's and the guard's reason codes, `upstream_http_<status>` for a standard HTTP status,
  `upstream_http_other` for any other; else OTHER.

Spans are not aggregated and keep the values as they were. The vocabulary is the defaults until a guard is
built from a config (`configure`), in the proxy and in a worker alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from http import HTTPStatus
from typing import get_args

from morphguard.config import DETECTOR_SECTIONS, Action, Config, PolicySettings, ProxySettings, TelemetrySettings
from morphguard.folding import model_name, model_names

OTHER = "other"
GENERAL = "general"  # the topic of a request no rule matched (policy.engine.GENERAL)
_ACTIONS = frozenset(get_args(Action))
_STATUSES = frozenset(str(s.value) for s in HTTPStatus)
_UPSTREAM_HTTP = "upstream_http_"
# Why a request ended without a check or in an error: the `code`s of proxy/errors.py and the guard's reasons.
REASONS = frozenset({
    "invalid_request", "invalid_api_key", "unchecked_route", "not_found", "request_too_large", "method_not_allowed",
    "http_error", "internal_error", "upstream_error", "upstream_unavailable", "upstream_malformed",
    "upstream_stream_broken", "upstream_timeout", "stream_error", "no_context", "no_answer", "queue_full",
    "check_crashed", "client_disconnected", "audit_failed", "judge_error", "judge_timeout", "judge_call_cap",
    "check_too_large",
    "latency_budget_exceeded", "expired", "queue_unavailable", "tool_calls_unchecked", "unreadable_output",
    "store_unavailable", "upstream_busy", "stream_interrupted", "unsealed_reply"})
_CACHED = 4096  # model names remembered with their label; more and the memo starts over


@dataclass
class Vocabulary:
    """What labels may say under one configuration."""

    models: list[tuple[str, str]]  # (the label: a pattern as configured, the pattern normalised)
    topics: frozenset[str]
    profiles: frozenset[str]
    _memo: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, telemetry: TelemetrySettings, policy: PolicySettings, proxy: ProxySettings) -> Vocabulary:
        patterns = [*telemetry.metric_models, *(m for route in policy.routes for m in route.models),
                    *(f"{route.prefix}*" for route in proxy.litellm_routes)]
        unique = list(dict.fromkeys(p for p in patterns if p.strip()))
        return cls([(p, model_name(p)) for p in unique], frozenset(policy.topics) | {GENERAL},
                   frozenset(policy.profiles))

    def model(self, name: str) -> str:
        label = self._memo.get(name)
        if label is None:
            names = model_names(name)
            label = next((label for label, pattern in self.models
                          if any(fnmatchcase(n, pattern) for n in names)), OTHER)
            if len(self._memo) >= _CACHED:
                self._memo.clear()
            self._memo[name] = label
        return label


_vocabulary: Vocabulary | None = None


def configure(config: Config) -> None:
    """Labels from this config from now on (the guard calls it; the process has one metrics pipeline)."""
    global _vocabulary
    _vocabulary = Vocabulary.of(config.telemetry, config.policy, config.proxy)


def vocabulary() -> Vocabulary:
    global _vocabulary
    if _vocabulary is None:  # nothing configured yet: the defaults
        _vocabulary = Vocabulary.of(TelemetrySettings(), PolicySettings(), ProxySettings())
    return _vocabulary


def model(name: str | None) -> str | None:
    return vocabulary().model(name) if name else None


def topic(name: str) -> str:
    return name if name in vocabulary().topics else OTHER


def profile(name: str) -> str:
    return name if name in vocabulary().profiles else OTHER


def action(name: str) -> str:
    return name if name in _ACTIONS else OTHER


def detector(name: str) -> str:
    return name if name in DETECTOR_SECTIONS else OTHER


def unchecked(reason_given: str | None) -> str:
    """Why a decision was taken with no check, as a reason code: `fail_open: judge_error` is judge_error (the
    action says which way it went)."""
    code = (reason_given or "").rpartition(": ")[2]
    return reason(code) if code else OTHER


def error_type(given: str) -> str:
    """A failed call's `error.type`: an HTTP status as a standard one or `_OTHER`, an exception's class name."""
    if given.isdigit():
        return given if given in _STATUSES else "_OTHER"
    return given if given.isidentifier() and len(given) <= 64 else "_OTHER"


def reason(code: str) -> str:
    if code in REASONS:
        return code
    if code.startswith(_UPSTREAM_HTTP):
        return code if code.removeprefix(_UPSTREAM_HTTP) in _STATUSES else f"{_UPSTREAM_HTTP}other"
    return OTHER
