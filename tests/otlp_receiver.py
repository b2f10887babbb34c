"""An OTLP/HTTP receiver on loopback for tests: it takes what exporters send to /v1/traces and
/v1/metrics (protobuf, as the SDK's exporters send it) and keeps it decoded for assertions."""

from __future__ import annotations

import gzip
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.servers import bound_socket


@dataclass
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    links: list[str]  # trace ids of the linked spans
    attributes: dict[str, Any]
    resource: dict[str, Any]


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def _attributes(items: Any) -> dict[str, Any]:
    return {a.key: _value(a.value) for a in items}


@dataclass
class OtlpReceiver:
    spans: list[ReceivedSpan] = field(default_factory=list)
    metrics: list[tuple[dict[str, Any], str]] = field(default_factory=list)  # (resource, metric name)
    payloads: list[bytes] = field(default_factory=list)  # every trace export as received: to search for any text

    def __post_init__(self) -> None:
        app = Starlette(routes=[Route("/v1/traces", self._traces, methods=["POST"]),
                                Route("/v1/metrics", self._metrics, methods=["POST"])])
        self._socket = bound_socket()
        self.port = self._socket.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]}, daemon=True)

    @staticmethod
    async def _body(request: Request) -> bytes:
        body = await request.body()
        return gzip.decompress(body) if request.headers.get("content-encoding") == "gzip" else body

    async def _traces(self, request: Request) -> Response:
        message = trace_service_pb2.ExportTraceServiceRequest()
        body = await self._body(request)
        self.payloads.append(body)
        message.ParseFromString(body)
        for resource_spans in message.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    self.spans.append(ReceivedSpan(
                        span.name, span.trace_id.hex(), span.span_id.hex(), span.parent_span_id.hex(),
                        [link.trace_id.hex() for link in span.links], _attributes(span.attributes), resource))
        return Response(trace_service_pb2.ExportTraceServiceResponse().SerializeToString(),
                        media_type="application/x-protobuf")

    async def _metrics(self, request: Request) -> Response:
        message = metrics_service_pb2.ExportMetricsServiceRequest()
        message.ParseFromString(await self._body(request))
        for resource_metrics in message.resource_metrics:
            resource = _attributes(resource_metrics.resource.attributes)
            for scope in resource_metrics.scope_metrics:
                self.metrics.extend((resource, m.name) for m in scope.metrics)
        return Response(metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString(),
                        media_type="application/x-protobuf")

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=5)

    def named(self, name: str) -> list[ReceivedSpan]:
        return [s for s in self.spans if s.name == name]
