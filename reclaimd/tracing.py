"""One OpenTelemetry trace per notice, in the semantic conventions' words.

Export: OTLP when any standard ``OTEL_EXPORTER_OTLP_*`` variable is set (gRPC, or HTTP/protobuf
when ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` / ``OTEL_EXPORTER_OTLP_PROTOCOL`` says ``http/...``;
endpoint, headers and TLS come from the same variables, read by the exporter itself), otherwise a
local JSON-lines file that ``reclaimd postmortem`` reads. The file exporter writes one span per
line, flushed per batch, so a crash loses at most the spans still in the batch queue.

Shape of a notice's telemetry:

* ``receive <queue>`` (``Receipts``): one short span per delivery of a notice, from parse to the
  transport's settle, with ``messaging.*`` and the admission (claimed, duplicate, ...). It is
  its own trace, linked to the producer's context when the message carried a ``traceparent``.
* ``reclaimd.notice`` (``notice_span``): the root of the notice's trace, from receipt to the
  last ledger write; the *process* span of the message (kind CONSUMER for a messaging
  transport). It carries ``cloud.*``, ``host.id`` (the instance id: the join key to billing),
  ``k8s.*`` and ``messaging.*`` beside reclaimd's facts (deadline, window), an event at the
  provider's notice time so the detection lag shows, and span links to the receive span and to
  the producer. Links, not parentage: one message may carry several notices and a notice may be
  resumed by another process, as the messaging conventions recommend.
* The pipeline's steps are its children; errors are recorded on the span where they happen.

Attribute values are bounded: ids, enums, times, numbers. No payload text reaches a span.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
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
from opentelemetry.util.types import AttributeValue

from reclaimd import __version__, handlers
from reclaimd.model import Notice, Placement, TraceContext, rfc3339, utcnow

TRACER_NAME = "reclaimd"
ROOT_SPAN = "reclaimd.notice"
RECEIVE_SPAN = "reclaimd.receive"  # a receipt from a source that is no message queue
# Which link is which, on the root span: the receive span or the producer's context.
LINK_KIND = "reclaimd.link"
# The semantic conventions release the attribute names follow (messaging: the v1.26+ names).
SCHEMA_URL = "https://opentelemetry.io/schemas/1.30.0"

_propagator = TraceContextTextMapPropagator()
Attributes = dict[str, AttributeValue]


# --- export -------------------------------------------------------------------------------


class JsonLinesExporter(SpanExporter):
    """Appends finished spans to a file, one JSON object per line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        # Kept open, unbuffered past each write: an append is in the kernel when export
        # returns, so a SIGKILL loses no span already ended.
        self._file = path.open("a", encoding="utf-8", buffering=1)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = [json.dumps(span_to_json(s), separators=(",", ":")) for s in spans]
        with self._lock:
            self._file.write("\n".join(lines) + "\n")
            self._file.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            self._file.close()


def span_to_json(s: ReadableSpan) -> dict[str, Any]:
    ctx = s.get_span_context()
    parent = s.parent
    return {
        "trace_id": f"{ctx.trace_id:032x}" if ctx else "",
        "span_id": f"{ctx.span_id:016x}" if ctx else "",
        "parent_id": f"{parent.span_id:016x}" if parent else "",
        "name": s.name,
        "kind": s.kind.name,
        "start_ns": s.start_time,
        "end_ns": s.end_time,
        "status": s.status.status_code.name,
        "status_message": s.status.description or "",
        "attributes": dict(s.attributes or {}),
        "events": [
            {"name": e.name, "ts_ns": e.timestamp, "attributes": dict(e.attributes or {})}
            for e in s.events
        ],
        "links": [
            {
                "trace_id": f"{lk.context.trace_id:032x}",
                "span_id": f"{lk.context.span_id:016x}",
                "attributes": dict(lk.attributes or {}),
            }
            for lk in s.links
        ],
    }


_OTHER_SIGNALS = ("OTEL_EXPORTER_OTLP_METRICS_", "OTEL_EXPORTER_OTLP_LOGS_")


def otlp_protocol(env: Mapping[str, str]) -> str | None:
    """``grpc`` or ``http/protobuf`` when OTLP export is configured, else None.

    The traces-specific variable wins over the general one, as the exporter spec says. The
    metrics' and logs' own variables say nothing of traces: alone, they leave the span file
    (and the exporter, grpc with it, unimported).
    """
    if not any(
        k.startswith("OTEL_EXPORTER_OTLP_") and not k.startswith(_OTHER_SIGNALS) for k in env
    ):
        return None
    protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"
    )
    return "http/protobuf" if protocol.strip().startswith("http") else "grpc"


def setup(
    *,
    service: str,
    span_file: Path | None,
    synchronous: bool = False,
    resource_attributes: Mapping[str, str] | None = None,
) -> TracerProvider:
    """A tracer provider for one daemon. ``synchronous`` exports each span as it ends (drills).

    It is not installed globally, so several daemons (tests, drills) can live in one process.
    ``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_SERVICE_NAME`` are merged in by the SDK.
    """
    attrs: dict[str, str] = {"service.name": service, "service.version": __version__}
    attrs.update(resource_attributes or {})
    provider = TracerProvider(resource=Resource.create(attrs, schema_url=SCHEMA_URL))
    exporter: SpanExporter | None = None
    protocol = otlp_protocol(os.environ)
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpExporter,
        )

        exporter = HttpExporter()
    elif protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        exporter = GrpcExporter()
    elif span_file is not None:
        # Each span appended as it ends: a replica killed mid-storm loses none of the spans
        # of the notices it finished (batched, the last half second of them went with it).
        provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(span_file)))
    if exporter is not None:
        processor = (
            SimpleSpanProcessor(exporter)
            if synchronous
            else BatchSpanProcessor(exporter, schedule_delay_millis=EXPORT_DELAY_MS)
        )
        provider.add_span_processor(processor)
    return provider


# OTLP export is batched (a network round trip per span would cost the storm); the SDK's
# default delay (5 s) lost whole traces of notices finished seconds before a SIGKILL.
EXPORT_DELAY_MS = 500


# --- context propagation ------------------------------------------------------------------


def current_traceparent() -> str:
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get("traceparent", "")


def context_of(traceparent: str) -> trace.SpanContext | None:
    """The span context a W3C ``traceparent`` names, or None when it is absent or invalid."""
    if not traceparent:
        return None
    ctx = _propagator.extract({"traceparent": traceparent})
    span_ctx = trace.get_current_span(ctx).get_span_context()
    return span_ctx if span_ctx.is_valid else None


def link_from(traceparent: str) -> list[trace.Link]:
    """A span link to the producer of a message that carried a ``traceparent``."""
    ctx = context_of(traceparent)
    return [trace.Link(ctx, {LINK_KIND: "producer"})] if ctx is not None else []


# --- where a notice came from -------------------------------------------------------------


# A notice's cloud and transport come from its source's registry entry (``Origin``).
origin_of = handlers.origin_of


def notice_attributes(notice: Notice, *, cluster: str = "") -> Attributes:
    """Attributes of a notice's root span: reclaimd's facts, then the semantic conventions."""
    attrs: Attributes = {
        "reclaimd.notice.id": notice.id,
        "reclaimd.notice.source": notice.source,
        "reclaimd.notice.kind": notice.kind.value,
        "reclaimd.notice.response": notice.response.value,
        "reclaimd.notice.target": notice.target.describe(),
        "reclaimd.notice.issued_at": rfc3339(notice.issued_at),
    }
    if notice.deadline is not None:
        attrs["reclaimd.deadline"] = notice.deadline.isoformat()
        attrs["reclaimd.window_s"] = (notice.deadline - notice.issued_at).total_seconds()
    where = Placement.of(notice)
    origin = origin_of(notice.source)
    instance_id = notice.target.instance_id
    optional: dict[str, str] = {
        "cloud.provider": origin.provider,
        "cloud.platform": origin.platform,
        "cloud.region": where.region,
        "cloud.availability_zone": where.zone,
        "cloud.account.id": where.account or where.project,
        # The instance's own id (an ARN), as cloud.resource_id asks, when the source says how.
        "cloud.resource_id": origin.resource_id(where, instance_id) if origin.resource_id else "",
        "host.id": instance_id or where.gce_instance_id,
        "host.type": where.instance_type,
        "k8s.cluster.name": cluster,
        "k8s.node.name": notice.target.node_name,
    }
    if notice.target.workload is not None:
        optional["k8s.namespace.name"] = notice.target.workload.namespace
        optional["reclaimd.workload.name"] = notice.target.workload.name
    attrs.update({k: v for k, v in optional.items() if v})
    if origin.messaging:
        attrs["messaging.system"] = origin.messaging
        attrs["messaging.operation.type"] = "process"
        attrs["messaging.operation.name"] = "process"
    elif origin.transport:
        attrs["reclaimd.transport"] = origin.transport
    return attrs


def notice_links(notice: Notice, receipt: trace.SpanContext | None = None) -> list[trace.Link]:
    """The root span's links: the delivery that brought the notice, and its producer."""
    links = [trace.Link(receipt, {LINK_KIND: "receive"})] if receipt is not None else []
    return links + link_from(TraceContext.of(notice).traceparent)


def notice_kind(notice: Notice) -> trace.SpanKind:
    messaging = origin_of(notice.source).messaging
    return trace.SpanKind.CONSUMER if messaging else trace.SpanKind.INTERNAL


@contextlib.contextmanager
def notice_span(
    tracer: trace.Tracer,
    notice: Notice,
    *,
    cluster: str = "",
    receipt: trace.SpanContext | None = None,
    earlier: Sequence[str] = (),
) -> Iterator[trace.Span]:
    """The root span of a notice's trace, started when the notice was received (so the time
    spent in the transport and in the claim shows in the post-mortem). An exception leaving it
    is recorded on it and sets its status. ``earlier``: traceparents of the traces that acted
    on this notice before (a replica that died mid-notice), linked as ``takeover``."""
    taken: list[trace.Link] = []
    for parent in dict.fromkeys(p for p in earlier if p):
        ctx = context_of(parent)
        if ctx is not None:
            taken.append(trace.Link(ctx, {LINK_KIND: "takeover"}))
    with tracer.start_as_current_span(
        ROOT_SPAN,
        kind=notice_kind(notice),
        attributes=notice_attributes(notice, cluster=cluster),
        links=notice_links(notice, receipt) + taken,
        start_time=ns(notice.received_at),
    ) as root:
        # The provider's own time of the notice: before the span starts, by the detection lag.
        root.add_event("reclaimd.notice.issued", timestamp=ns(notice.issued_at))
        yield root


def producer_attributes(system: str, destination: str, count: int) -> Attributes:
    """Attributes of a span that creates messages (the ledger's restart-waste events)."""
    attrs: Attributes = {
        "messaging.system": system,
        "messaging.operation.type": "create",
        "messaging.operation.name": "create",
        "messaging.batch.message_count": count,
    }
    if destination:
        attrs["messaging.destination.name"] = destination
    return attrs


def ns(t: datetime) -> int:
    return int(t.timestamp() * 1e9)


# --- receipts -----------------------------------------------------------------------------


class Receipts:
    """One receive span per delivery of a notice; the intake hands its context on to the root.

    ``on_admission`` fits ``Intake(on_admission=...)``: intake calls it once per notice of a
    message, after the claim, before the transport settles the message. The span covers parse
    to admission. The admitting delivery's span is the one the root links to; a redelivery
    (duplicate) gets its own span, which shows in the backend.
    ``destinations`` names the queue, subscription or topic per ``messaging.system``.
    """

    def __init__(
        self,
        tracer: trace.Tracer,
        *,
        destinations: Mapping[str, str] | None = None,
    ) -> None:
        self.tracer = tracer
        self.destinations = dict(destinations or {})

    def on_admission(self, notice: Notice, admission: str) -> trace.SpanContext:
        """Record the receive span; its context, for the notice's root span to link to."""
        origin = origin_of(notice.source)
        attrs: Attributes = {
            "reclaimd.notice.id": notice.id,
            "reclaimd.notice.source": notice.source,
            "reclaimd.admission": str(admission),
        }
        if origin.messaging:
            destination = self.destinations.get(origin.messaging, "")
            name = f"receive {destination or origin.messaging}"
            kind = trace.SpanKind.CLIENT  # a pull: the conventions' kind for receive
            attrs["messaging.system"] = origin.messaging
            attrs["messaging.operation.type"] = "receive"
            attrs["messaging.operation.name"] = "receive"
            if destination:
                attrs[origin.destination_key] = destination
        else:
            name, kind = RECEIVE_SPAN, trace.SpanKind.INTERNAL
            if origin.transport:
                attrs["reclaimd.transport"] = origin.transport
        span = self.tracer.start_span(
            name,
            context=trace.set_span_in_context(trace.INVALID_SPAN),  # a trace of its own
            kind=kind,
            attributes=attrs,
            links=link_from(TraceContext.of(notice).traceparent),
            start_time=ns(notice.received_at),
        )
        span.end(end_time=ns(utcnow()))
        return span.get_span_context()
