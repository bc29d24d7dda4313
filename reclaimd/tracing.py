"""One OpenTelemetry trace per notice.

Export goes to OTLP when the standard ``OTEL_EXPORTER_OTLP_*`` variables are set, otherwise to
a local JSON-lines file that ``reclaimd postmortem`` reads. The file exporter writes one span
per line, flushed per batch, so a crash loses at most the spans still in the batch queue.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

TRACER_NAME = "reclaimd"
_propagator = TraceContextTextMapPropagator()


class JsonLinesExporter(SpanExporter):
    """Appends finished spans to a file, one JSON object per line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = [json.dumps(span_to_json(s), separators=(",", ":")) for s in spans]
        with self._lock, self.path.open("a", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def span_to_json(s: ReadableSpan) -> dict[str, Any]:
    ctx = s.get_span_context()
    parent = s.parent
    return {
        "trace_id": f"{ctx.trace_id:032x}" if ctx else "",
        "span_id": f"{ctx.span_id:016x}" if ctx else "",
        "parent_id": f"{parent.span_id:016x}" if parent else "",
        "name": s.name,
        "start_ns": s.start_time,
        "end_ns": s.end_time,
        "status": s.status.status_code.name,
        "attributes": dict(s.attributes or {}),
        "events": [
            {"name": e.name, "ts_ns": e.timestamp, "attributes": dict(e.attributes or {})}
            for e in s.events
        ],
        "links": [
            {"trace_id": f"{lk.context.trace_id:032x}", "span_id": f"{lk.context.span_id:016x}"}
            for lk in s.links
        ],
    }


def setup(*, service: str, span_file: Path | None, synchronous: bool = False) -> TracerProvider:
    """A tracer provider for one daemon. ``synchronous`` exports each span as it ends (drills).

    It is not installed globally, so several daemons (tests, drills) can live in one process.
    """
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    exporter: SpanExporter | None = None
    if any(k.startswith("OTEL_EXPORTER_OTLP_") for k in os.environ):
        protocol = os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        if protocol.startswith("http"):
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                OTLPSpanExporter as HttpExporter,
            )

            exporter = HttpExporter()
        else:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcExporter,
            )

            exporter = GrpcExporter()
    elif span_file is not None:
        exporter = JsonLinesExporter(span_file)
    if exporter is not None:
        processor = SimpleSpanProcessor(exporter) if synchronous else BatchSpanProcessor(exporter)
        provider.add_span_processor(processor)
    return provider


def current_traceparent() -> str:
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get("traceparent", "")


def link_from(traceparent: str) -> list[trace.Link]:
    """A span link to the producer of a message that carried a ``traceparent``."""
    if not traceparent:
        return []
    ctx = _propagator.extract({"traceparent": traceparent})
    span_ctx = trace.get_current_span(ctx).get_span_context()
    return [trace.Link(span_ctx)] if span_ctx.is_valid else []
