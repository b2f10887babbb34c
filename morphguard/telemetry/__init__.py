"""Spans, events and metrics for every request and every check.

Instrumented code calls the helpers here; they go through the OpenTelemetry API, which does nothing
until `telemetry.setup.configure` installs providers. Names come from `telemetry.names` only. Metric labels
come from configured values only (`telemetry.labels`); spans keep the values as they were.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from functools import cache
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics, trace
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from morphguard.telemetry import labels, names, setup

if TYPE_CHECKING:  # for annotations only: telemetry imports no other layer at run time
    from morphguard.models import Decision, Detection

# How a policy action reads as a guardrail decision.
DECISION_TYPE = {"pass": "allow", "annotate": "warn", "highlight": "modify", "cite": "modify",
                 "regenerate": "modify", "block": "deny"}


@cache  # a proxy tracer until a provider is installed, then that provider's: asking once is enough
def tracer() -> trace.Tracer:
    return trace.get_tracer(names.TRACER_NAME)


def tracing() -> bool:
    """Whether a tracer provider is installed (else every span is a no-op). Asked on every request: the
    API's getter reads the environment on each call until a provider is set, so its global is read first."""
    provider = getattr(trace, "_TRACER_PROVIDER", _UNKNOWN)
    if provider is _UNKNOWN:  # an API version without that global
        return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    return provider is not None


_UNKNOWN = object()


_SECONDS = [0.01 * 2 ** i for i in range(14)]  # 10 ms to 82 s


@cache
def _instruments() -> dict[str, Any]:
    meter = metrics.get_meter(names.TRACER_NAME)
    return {
        # Bucket boundaries: the GenAI conventions' advice for tokens and call durations; tenths for scores.
        "tokens": meter.create_histogram(names.METRIC_TOKENS, unit="{token}",
                                         description="Tokens per LLM call, by type (input, output)",
                                         explicit_bucket_boundaries_advisory=[4.0 ** i for i in range(14)]),
        "duration": meter.create_histogram(names.METRIC_DURATION, unit="s", description="LLM call duration",
                                           explicit_bucket_boundaries_advisory=_SECONDS),
        "score": meter.create_histogram(names.METRIC_SCORE, unit="1", description="Hallucination score per check",
                                        explicit_bucket_boundaries_advisory=[i / 10 for i in range(11)]),
        "check_duration": meter.create_histogram(names.METRIC_CHECK_DURATION, unit="s",
                                                 description="Wall time of one check, judge calls included",
                                                 explicit_bucket_boundaries_advisory=_SECONDS),
        "decisions": meter.create_counter(
            names.METRIC_DECISIONS, unit="{decision}",
            description="Policy decisions by action and topic; checked=false with the reason no check decided"),
        "queue": [meter.create_observable_gauge(name, [_observe(key)], unit="{check}", description=text)
                  for name, key, text in (
                      (names.METRIC_QUEUE_DEPTH, "backlog", "Checks waiting in the async queue or being checked"),
                      (names.METRIC_QUEUE_CLAIMED, "claimed", "Checks a worker has taken and not finished"),
                      (names.METRIC_QUEUE_LAG, "lag", "Checks no worker has taken yet"),
                      (names.METRIC_QUEUE_DEAD, "dead_letters", "Poison checks moved to the dead-letter stream"),
                      (names.METRIC_QUEUE_REDELIVERIES, "redeliveries",
                       "Checks this process took over from a worker that died"),
                      (names.METRIC_QUEUE_REFUSED, "refused",
                       "Queue entries and replies this process refused: not sealed with the fleet key"),
                      (names.METRIC_ESCALATION_BACKLOG, "escalation_backlog",
                       "Escalations the webhook has not taken yet that will still be tried"))],
        "fail_open": meter.create_counter(names.METRIC_FAIL_OPEN, unit="{check}",
                                          description="Answers passed unchecked: their check could not decide"),
        "errors": meter.create_counter(
            names.METRIC_ERRORS, unit="{error}",
            description="Requests that ended in an error, checks the judge failed, audit rows not written"),
        "judge_restarts": meter.create_counter(names.METRIC_JUDGE_RESTARTS, unit="{restart}",
                                               description="Restarts of the embedded judge after it died"),
        "shadow_checks": meter.create_counter(
            names.METRIC_SHADOW_CHECKS, unit="{check}",
            description="A shadow candidate's checks: whether it agreed with the live decision, would flag or block"),
        "shadow_duration": meter.create_histogram(names.METRIC_SHADOW_DURATION, unit="s",
                                                  description="Wall time of a shadow candidate's check",
                                                  explicit_bucket_boundaries_advisory=_SECONDS),
        "shadow_tokens": meter.create_counter(names.METRIC_SHADOW_TOKENS, unit="{token}",
                                              description="Tokens a shadow candidate's judge used, by type"),
    }


def untraced() -> AbstractContextManager[None]:
    """No spans inside: for our own polling (judge start-up, readiness probes), which is not a request
    anyone would look for in a trace and would otherwise show up as stray root spans."""
    from opentelemetry.instrumentation.utils import suppress_instrumentation

    return suppress_instrumentation()


def trace_id(span: Span | None = None) -> str | None:
    context = (span or trace.get_current_span()).get_span_context()
    return f"{context.trace_id:032x}" if context.is_valid else None


# --- GenAI client calls (upstream and judge) ---------------------------------------------------------------

def start_chat_span(model: str | None, provider: str, role: str, messages: Any = None,
                    server: tuple[str, int] | None = None, operation: str = names.OP_CHAT) -> Span:
    """A GenAI client span `chat {model}` (or a served verifier's `{operation} {model}`: predict, classify, score),
    a child of the current span; the caller ends it. `server`: the configured address and port the call goes to,
    where one is known."""
    attributes: dict[str, AttributeValue] = {names.OPERATION_NAME: operation, names.PROVIDER_NAME: provider,
                                             names.ROLE: role}
    if server:
        attributes |= {names.SERVER_ADDRESS: server[0], names.SERVER_PORT: server[1]}
    if model:
        attributes[names.REQUEST_MODEL] = model
    if setup.options.openinference:
        attributes[names.OI_SPAN_KIND] = "LLM"
        if model:
            attributes[names.OI_MODEL] = model
    if setup.options.capture_content and messages is not None:
        attributes[names.INPUT_MESSAGES] = json.dumps(messages, ensure_ascii=False)
        if setup.options.openinference:
            attributes[names.OI_INPUT] = attributes[names.INPUT_MESSAGES]
    return tracer().start_span(names.SPAN_CHAT.format(operation=operation, model=model or "unknown"),
                               kind=SpanKind.CLIENT,
                               attributes=attributes)


def record_chat(span: Span, *, provider: str, role: str, request_model: str | None, response_model: str | None,
                input_tokens: int | None, output_tokens: int | None, finish_reasons: Sequence[str] = (),
                seconds: float, output_text: str | None = None, error: str | None = None,
                error_type: str | None = None, server: tuple[str, int] | None = None,
                operation: str = names.OP_CHAT) -> None:
    """The response side of a chat span (or a served verifier's), and the GenAI client metrics. A failed call is
    recorded too, with `error_type` (the provider's HTTP status, or the exception's class) on the span and the
    duration."""
    if response_model:
        span.set_attribute(names.RESPONSE_MODEL, response_model)
    if input_tokens is not None:
        span.set_attribute(names.INPUT_TOKENS, input_tokens)
    if output_tokens is not None:
        span.set_attribute(names.OUTPUT_TOKENS, output_tokens)
    if finish_reasons:
        span.set_attribute(names.FINISH_REASONS, list(finish_reasons))
    if setup.options.openinference:
        if input_tokens is not None:
            span.set_attribute(names.OI_PROMPT_TOKENS, input_tokens)
        if output_tokens is not None:
            span.set_attribute(names.OI_COMPLETION_TOKENS, output_tokens)
    if setup.options.capture_content and output_text is not None:
        span.set_attribute(names.OUTPUT_MESSAGES, json.dumps([{"role": "assistant", "content": output_text}],
                                                             ensure_ascii=False))
        if setup.options.openinference:
            span.set_attribute(names.OI_OUTPUT, output_text)
    if error or error_type:
        span.set_status(Status(StatusCode.ERROR, error or error_type))
    if error_type:
        span.set_attribute(names.ERROR_TYPE, error_type)
    common: dict[str, AttributeValue] = {names.OPERATION_NAME: operation, names.PROVIDER_NAME: provider,
                                         names.ROLE: role}
    # The upstream's model is the client's string; the judge's comes from the config.
    label = request_model if role == "judge" else labels.model(request_model)
    if label:
        common[names.REQUEST_MODEL] = label
    if response_model:  # the provider's string: a configured pattern or OTHER
        common[names.RESPONSE_MODEL] = labels.model(response_model) or labels.OTHER
    if server:  # configured, so bounded
        common |= {names.SERVER_ADDRESS: server[0], names.SERVER_PORT: server[1]}
    instruments = _instruments()
    instruments["duration"].record(seconds, {**common, names.ERROR_TYPE: labels.error_type(error_type)}
                                   if error_type else common)
    if input_tokens is not None:
        instruments["tokens"].record(input_tokens, {**common, names.TOKEN_TYPE: "input"})
    if output_tokens is not None:
        instruments["tokens"].record(output_tokens, {**common, names.TOKEN_TYPE: "output"})


# --- the check -----------------------------------------------------------------------------------------------

@contextmanager
def guardrail_span(request_id: str, mode: str, link_to: trace.SpanContext | None = None) -> Iterator[Span]:
    """`apply_guardrail morphguard`: a child of the current (chat) span inline; async, the root of its own
    trace, linked to the request's chat span (both carry the request id)."""
    attributes = {names.OPERATION_NAME: names.OP_GUARDRAIL, names.GUARDRAIL_NAME: "morphguard",
                  names.GUARDRAIL_TARGET: "llm_output", names.REQUEST_ID: request_id, names.CHECK_MODE: mode}
    if setup.options.openinference:
        attributes[names.OI_SPAN_KIND] = "GUARDRAIL"
    if link_to is not None and link_to.is_valid:
        from opentelemetry.context import Context

        with tracer().start_as_current_span(names.SPAN_GUARDRAIL, context=Context(), links=[Link(link_to)],
                                            attributes=attributes) as span:
            yield span
    else:
        with tracer().start_as_current_span(names.SPAN_GUARDRAIL, attributes=attributes) as span:
            yield span


def carrier() -> dict[str, str]:
    """The current trace context as W3C headers, to travel with a queued job (`continued` on the far side)."""
    from opentelemetry import propagate

    headers: dict[str, str] = {}
    propagate.inject(headers)
    return headers


@contextmanager
def continued(headers: dict[str, str] | None, name: str, request_id: str) -> Iterator[Span]:
    """A span in the trace `headers` came from (another process's `carrier`)."""
    from opentelemetry import propagate

    parent = propagate.extract(headers or {})
    with tracer().start_as_current_span(name, context=parent, kind=SpanKind.CONSUMER,
                                        attributes={names.REQUEST_ID: request_id}) as span:
        yield span


@contextmanager
def stage_span(stage: str) -> Iterator[Span]:
    with tracer().start_as_current_span(stage, attributes={names.STAGE: stage}) as span:  # named after its stage
        yield span


def record_check(span: Span, evaluated: Span, *, decision: Decision, detection: Detection | None,
                 question: str | None = None, context: Sequence[str] | None = None, answer: str | None = None) -> None:
    """Policy outcome on the guardrail span, factoid events, the evaluation event on `evaluated`, metrics.

    `decision` is a models.Decision and `detection` a models.Detection (or None when unchecked).
    """
    span.set_attribute(names.PROFILE, decision.profile)
    span.set_attribute(names.TOPIC, decision.topic)
    span.set_attribute(names.THRESHOLD, decision.threshold)
    span.set_attribute(names.ACTION, decision.action)
    span.set_attribute(names.FLAGGED, decision.flagged)
    span.set_attribute(names.GUARDRAIL_DECISION, DECISION_TYPE.get(decision.action, "allow"))
    if decision.reason:
        span.set_attribute(names.REASON, decision.reason)
        span.set_attribute(names.GUARDRAIL_REASON, decision.reason)
    capture = setup.options.capture_content
    if capture:
        for key, value in ((names.QUESTION, question), (names.ANSWER, answer),
                           (names.CONTEXT, "\n\n".join(context) if context else None)):
            if value:
                span.set_attribute(key, value)
    instruments = _instruments()
    topic, profile = labels.topic(decision.topic), labels.profile(decision.profile)
    counted: dict[str, AttributeValue] = {names.ACTION: labels.action(decision.action), names.TOPIC: topic,
                                          names.PROFILE: profile, names.FLAGGED: decision.flagged,
                                          names.CHECKED: detection is not None}
    if detection is None:  # why not: no context, no answer, an upstream error, a check that failed
        counted[names.REASON] = labels.unchecked(decision.reason)
    instruments["decisions"].add(1, counted)
    if detection is None:
        if decision.unchecked:
            instruments["fail_open"].add(1, {names.PROFILE: profile, names.TOPIC: topic})
        return
    span.set_attribute(names.DETECTOR, detection.detector)
    span.set_attribute(names.SCORE, detection.score)
    span.set_attribute(names.FACTOIDS, len(detection.factoids))
    detector = labels.detector(detection.detector)
    instruments["score"].record(detection.score, {names.DETECTOR: detector, names.TOPIC: topic})
    instruments["check_duration"].record(detection.cost.seconds, {names.DETECTOR: detector, names.TOPIC: topic})
    for factoid in detection.factoids:
        event: dict[str, AttributeValue] = {names.FACTOID_SCORE: factoid.score,
                                            names.FACTOID_FLAGGED: factoid.score >= decision.threshold}
        if factoid.start is not None and factoid.end is not None:
            event |= {names.FACTOID_START: factoid.start, names.FACTOID_END: factoid.end}
        if capture:
            event[names.FACTOID_TEXT] = factoid.text
        span.add_event(names.EVENT_FACTOID, event)
    label = "hallucinated" if decision.flagged else "faithful"
    flagged = [f for f in detection.factoids if f.score >= decision.threshold]
    explanation = (f"{len(flagged)} of {len(detection.factoids)} factoids at or above the threshold "
                   f"{decision.threshold:g}; highest {detection.score:.2f}")
    evaluation: dict[str, AttributeValue] = {
        names.EVALUATION_NAME: names.EVALUATION_HALLUCINATION, names.EVALUATION_SCORE: detection.score,
        names.EVALUATION_LABEL: label, names.EVALUATION_EXPLANATION: explanation}
    evaluated.add_event(names.EVENT_EVALUATION, evaluation)
    target = evaluated.get_span_context()
    if setup.annotation_sink is not None and target.is_valid and target.trace_flags.sampled:
        setup.annotation_sink.submit(format(target.span_id, "016x"), label=label, score=detection.score,
                                 explanation=explanation, identifier=format(target.trace_id, "032x"))
    if setup.options.openinference:
        span.set_attribute(names.OI_EVAL_NAME, names.EVALUATION_HALLUCINATION)
        span.set_attribute(names.OI_EVAL_SCORE, detection.score)
        span.set_attribute(names.OI_EVAL_LABEL, label)
        span.set_attribute(names.OI_EVAL_EXPLANATION, explanation)
        span.set_attribute(names.OI_OUTPUT, decision.action)


# The latest gauges of the queue and the escalation outbox (`queue_observed`); the SDK reads them when it
# collects metrics.
_queue_stats: dict[str, int] = {}


def _observe(key: str) -> Any:
    def observe(_options: metrics.CallbackOptions) -> list[metrics.Observation]:
        # zero until the first look at the queue: a panel or a rule reads 0, not "no data"
        return [metrics.Observation(_queue_stats.get(key, 0))]
    return observe


def prime() -> None:
    """Every counter series a dashboard or an alert rule reads, at zero, from the start: a rate over a series
    that does not exist yet is "no data", not 0. Called once the labels' vocabulary is configured."""
    instruments = _instruments()
    vocabulary = labels.vocabulary()
    for profile in sorted(vocabulary.profiles):
        for topic in sorted(vocabulary.topics):
            instruments["fail_open"].add(0, {names.PROFILE: profile, names.TOPIC: topic})
    for reason in sorted(labels.REASONS):
        instruments["errors"].add(0, {names.REASON: reason})
    instruments["judge_restarts"].add(0)


def queue_observed(stats: dict[str, int]) -> None:
    _instruments()
    _queue_stats.clear()
    _queue_stats.update(stats)


def count_error(reason: str) -> None:
    _instruments()["errors"].add(1, {names.REASON: labels.reason(reason)})


def judge_restarted() -> None:
    _instruments()["judge_restarts"].add(1)


def shadow_checked(candidate: str, outcome: str, *, would_flag: bool = False, would_block: bool = False,
                   seconds: float = 0.0, input_tokens: int = 0, output_tokens: int = 0) -> None:
    """One shadow check: `outcome` is agree, disagree or failed; `candidate` a configured name."""
    instruments = _instruments()
    instruments["shadow_checks"].add(1, {names.CANDIDATE: candidate, names.SHADOW_OUTCOME: outcome,
                                         names.WOULD_FLAG: would_flag, names.WOULD_BLOCK: would_block})
    if outcome != "failed":
        instruments["shadow_duration"].record(seconds, {names.CANDIDATE: candidate})
    for kind, tokens in (("input", input_tokens), ("output", output_tokens)):
        if tokens:
            instruments["shadow_tokens"].add(tokens, {names.CANDIDATE: candidate, names.TOKEN_TYPE: kind})
