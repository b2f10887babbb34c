"""OpenTelemetry providers, exporters and httpx instrumentation, configured once per process from config.

Unset fields fall back to the standard OTEL_* environment variables (endpoint, headers, service name,
sampler), which the SDK and its exporters read themselves.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass, field

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.util.http import ExcludeList, parse_excluded_urls

from morphguard.config import TelemetrySettings
from morphguard.telemetry import names

log = logging.getLogger(__name__)


DEFAULT_EXCLUDED_URLS = (r"/healthz$", r"/readyz$")


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


def _exporters(settings: TelemetrySettings) -> tuple[SpanExporter | None, object | None]:
    headers = {k: v.get_secret_value() for k, v in settings.headers.items()} or None
    kind = settings.exporter
    if kind == "console":
        from opentelemetry.sdk.metrics.export import ConsoleMetricExporter
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter(), ConsoleMetricExporter()
    if kind == "otlp-http":
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
            OTLPMetricExporter,
        )
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter,
        )

        base = settings.endpoint.rstrip("/") if settings.endpoint else None
        return (OTLPSpanExporter(endpoint=f"{base}/v1/traces" if base else None, headers=headers),
                OTLPMetricExporter(endpoint=f"{base}/v1/metrics" if base else None, headers=headers))
    if kind == "otlp-grpc":
        from opentelemetry.exporter.otlp.proto.grpc import metric_exporter, trace_exporter

        return (trace_exporter.OTLPSpanExporter(endpoint=settings.endpoint, headers=headers),
                metric_exporter.OTLPMetricExporter(endpoint=settings.endpoint, headers=headers))
    return None, None


def configure(settings: TelemetrySettings, *, span_exporter: SpanExporter | None = None,
              metric_reader: MetricReader | None = None) -> None:
    """Install the providers (once per process) and instrument httpx. Explicit exporters win (tests)."""
    global options, _configured
    options = Options(settings.capture_content, settings.openinference, settings.upstream_provider,
                      excluded_urls(settings))
    if _configured:
        return
    if settings.exporter == "none" and span_exporter is None and metric_reader is None:
        return  # the API's no-op providers stay: instrumented code costs next to nothing
    _configured = True
    attributes = ({} if os.environ.get("OTEL_SERVICE_NAME")
                  else {names.SERVICE_NAME: settings.service_name or "morphguard"})
    # Which replica or worker: with several on one backend, their metrics would otherwise add up as one.
    attributes[names.SERVICE_INSTANCE] = f"{socket.gethostname()}:{os.getpid()}"
    resource = Resource.create(attributes)
    spans, metric_exporter = _exporters(settings)
    spans = span_exporter or spans
    sampler = ParentBased(TraceIdRatioBased(settings.sampling_ratio)) if settings.sampling_ratio is not None else None
    tracer_provider = TracerProvider(resource=resource, sampler=sampler)
    if spans is not None:
        tracer_provider.add_span_processor(BatchSpanProcessor(spans, schedule_delay_millis=500))
    trace.set_tracer_provider(tracer_provider)
    readers: list[MetricReader] = []
    if metric_reader is not None:
        readers.append(metric_reader)
    elif settings.metrics and metric_exporter is not None:
        readers.append(PeriodicExportingMetricReader(metric_exporter,  # type: ignore[arg-type]
                                                     export_interval_millis=settings.metric_interval_s * 1000))
    if readers:
        metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=readers))
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

    HTTPXClientInstrumentor().instrument()
    log.info("telemetry: exporter %s", settings.exporter if span_exporter is None else "in-process")


def shutdown() -> None:
    """Flush what is buffered (at exit of the proxy)."""
    for provider in (trace.get_tracer_provider(), metrics.get_meter_provider()):
        flush = getattr(provider, "force_flush", None)
        if flush:
            flush()
