"""OpenTelemetry providers, exporters and httpx instrumentation, configured once per process from config.

A field the config leaves unset follows the standard OTEL_* environment variables as the SDK's own
autoconfiguration reads them: which exporter (OTEL_TRACES_EXPORTER, OTEL_METRICS_EXPORTER, otlp's
protocol), and, read by the SDK and its exporters themselves, endpoint, headers, resource and service
name, sampler, metric interval. A field the config sets wins.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.util.http import ExcludeList, parse_excluded_urls
from pydantic import SecretStr

from morphguard.config import TelemetrySettings

if TYPE_CHECKING:
    from morphguard.telemetry.annotations import AnnotationSink
from morphguard.telemetry import names

log = logging.getLogger(__name__)


DEFAULT_EXCLUDED_URLS = (r"/healthz$", r"/readyz$", r"/metrics$")


@dataclass(frozen=True)
class Options:
    """What instrumented code needs to know at run time."""

    capture_content: bool = False
    openinference: bool = False
    upstream_provider: str = "openai"
    excluded: ExcludeList = field(default_factory=lambda: ExcludeList(DEFAULT_EXCLUDED_URLS))


options = Options()


def excluded_urls(settings: TelemetrySettings) -> ExcludeList:
    """The config's list, else the OTEL_PYTHON_*_EXCLUDED_URLS convention, else the probes."""
    if settings.excluded_urls is not None:
        return ExcludeList(settings.excluded_urls)
    from_env = os.environ.get("OTEL_PYTHON_MORPHGUARD_EXCLUDED_URLS") or os.environ.get("OTEL_PYTHON_EXCLUDED_URLS")
    return parse_excluded_urls(from_env) if from_env else ExcludeList(DEFAULT_EXCLUDED_URLS)
_configured = False


Kind = Literal["none", "console", "otlp-http", "otlp-grpc", "prometheus"]
# OTEL_*_EXPORTER values as the SDK's autoconfiguration names them, and otlp's protocols.
_BY_ENV_NAME: dict[str, Kind] = {"none": "none", "console": "console", "otlp_proto_http": "otlp-http",
                                 "otlp_proto_grpc": "otlp-grpc", "prometheus": "prometheus"}
_BY_PROTOCOL: dict[str, Kind] = {"grpc": "otlp-grpc", "http/protobuf": "otlp-http"}


def exporter_kind(settings: TelemetrySettings, signal: Literal["traces", "metrics"]) -> Kind:
    """The config's exporter when set; else OTEL_<SIGNAL>_EXPORTER (metrics: else the traces' choice)."""
    if settings.exporter is not None:
        return settings.exporter
    given = [n.strip() for n in os.environ.get(f"OTEL_{signal.upper()}_EXPORTER", "").split(",") if n.strip()]
    if not given:
        return exporter_kind(settings, "traces") if signal == "metrics" else "none"
    name = given[0]
    if len(given) > 1:
        log.warning("OTEL_%s_EXPORTER names several exporters; morphguard uses the first, %s", signal.upper(), name)
    if name == "otlp":
        protocol = (os.environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL")
                    or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc").strip()
        if protocol not in _BY_PROTOCOL:
            log.warning("OTLP protocol %r is not supported (grpc, http/protobuf): %s not exported", protocol, signal)
            return "none"
        return _BY_PROTOCOL[protocol]
    if name not in _BY_ENV_NAME or name == "prometheus" and signal == "traces":
        log.warning("OTEL_%s_EXPORTER=%s is not supported here: %s not exported", signal.upper(), name, signal)
        return "none"
    return _BY_ENV_NAME[name]


def _span_exporter(kind: Kind, settings: TelemetrySettings, headers: dict[str, str] | None) -> SpanExporter | None:
    if kind == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if kind == "otlp-http":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        base = settings.endpoint.rstrip("/") if settings.endpoint else None
        return OTLPSpanExporter(endpoint=f"{base}/v1/traces" if base else None, headers=headers)
    if kind == "otlp-grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter

        return GrpcSpanExporter(endpoint=settings.endpoint, headers=headers)
    return None


def _metric_reader(kind: Kind, settings: TelemetrySettings, headers: dict[str, str] | None) -> MetricReader | None:
    exporter: Any = None
    if kind == "console":
        from opentelemetry.sdk.metrics.export import ConsoleMetricExporter

        exporter = ConsoleMetricExporter()
    elif kind == "otlp-http":
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        base = settings.endpoint.rstrip("/") if settings.endpoint else None
        exporter = OTLPMetricExporter(endpoint=f"{base}/v1/metrics" if base else None, headers=headers)
    elif kind == "otlp-grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetricExporter

        exporter = GrpcMetricExporter(endpoint=settings.endpoint, headers=headers)
    if exporter is None:
        return None
    interval = (settings.metric_interval_s * 1000 if settings.metric_interval_s
                else None if os.environ.get("OTEL_METRIC_EXPORT_INTERVAL") else 15_000)  # None: the SDK reads it
    return PeriodicExportingMetricReader(exporter, export_interval_millis=interval)


def resource(settings: TelemetrySettings) -> Resource:
    """The SDK's resource from the environment (OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME) with what the
    config sets on top, the process's identity, and "morphguard" where nothing names the service."""
    attributes: dict[str, str] = {
        # Which replica or worker: with several on one backend, their metrics would otherwise add up as one.
        names.SERVICE_INSTANCE: f"{socket.gethostname()}:{os.getpid()}"}
    if settings.service_name:
        attributes[names.SERVICE_NAME] = settings.service_name
    elif str(Resource.create({}).attributes.get(names.SERVICE_NAME, "")).startswith("unknown_service"):
        attributes[names.SERVICE_NAME] = "morphguard"
    if settings.project:
        attributes[names.OI_PROJECT] = settings.project
    return Resource.create(attributes)


def configure(settings: TelemetrySettings, *, span_exporter: SpanExporter | None = None,
              metric_reader: MetricReader | None = None) -> None:
    """Install the providers (once per process) and instrument httpx. Explicit exporters win (tests)."""
    global options, _configured, prometheus_enabled, metrics_token
    options = Options(settings.capture_content, settings.openinference, settings.upstream_provider,
                      excluded_urls(settings))
    metrics_token = settings.metrics_token
    if _configured:
        return
    headers = {k: v.get_secret_value() for k, v in settings.headers.items()} or None  # None: OTEL_..._HEADERS
    traces = exporter_kind(settings, "traces")
    spans = span_exporter or _span_exporter(traces, settings, headers)
    readers = [metric_reader] if metric_reader is not None else []
    if not readers and settings.metrics:
        reader = _metric_reader(exporter_kind(settings, "metrics"), settings, headers)
        readers += [reader] if reader is not None else []
    prometheus_enabled = settings.prometheus or exporter_kind(settings, "metrics") == "prometheus"
    if prometheus_enabled:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader

        readers.append(PrometheusMetricReader())
    global annotation_sink
    if settings.annotations.url and spans is not None:
        from morphguard.telemetry.annotations import AnnotationSink

        annotation_sink = AnnotationSink(settings.annotations)
    if spans is None and not readers:
        return  # the API's no-op providers stay: instrumented code costs next to nothing
    _configured = True
    described = resource(settings)
    if spans is not None:
        sampler = ParentBased(TraceIdRatioBased(settings.sampling_ratio)) \
            if settings.sampling_ratio is not None else None  # None: the SDK reads OTEL_TRACES_SAMPLER(_ARG)
        tracer_provider = TracerProvider(resource=described, sampler=sampler)
        tracer_provider.add_span_processor(BatchSpanProcessor(spans, schedule_delay_millis=500))
        trace.set_tracer_provider(tracer_provider)
    if readers:
        global metering
        metrics.set_meter_provider(MeterProvider(resource=described, metric_readers=readers))
        metering = True
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

    HTTPXClientInstrumentor().instrument()
    log.info("telemetry: traces to %s, metrics to %d readers", traces if span_exporter is None else "in-process",
             len(readers))


prometheus_enabled = False  # whether the proxy serves GET /metrics
metering = False  # whether a meter provider is installed (else every instrument is a no-op)
metrics_token: SecretStr | None = None  # what GET /metrics requires as a bearer token (proxy.gate); None: open
annotation_sink: AnnotationSink | None = None  # verdicts as Phoenix span annotations (telemetry.annotations)


def prometheus_text() -> tuple[bytes, str]:
    """The Prometheus exposition of every instrument (body, content type)."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    return generate_latest(), CONTENT_TYPE_LATEST


def shutdown() -> None:
    """Flush what is buffered (at exit of the proxy)."""
    if annotation_sink is not None:
        annotation_sink.close()
    for provider in (trace.get_tracer_provider(), metrics.get_meter_provider()):
        flush = getattr(provider, "force_flush", None)
        if flush:
            flush()
