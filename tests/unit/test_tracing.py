"""Tracing without a backend: attributes by the semantic conventions for each kind of source, the
root span's links and events, receive spans, the JSON-lines exporter and the export choice."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from shared_fixtures import FIXTURES

from reclaimd import handlers, postmortem, tracing
from reclaimd.model import Notice, frozen_map, utcnow

PRODUCER = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def notice(source: str, fixture: str) -> Notice:
    out = handlers.parse(source, (FIXTURES / fixture).read_bytes(), received_at=utcnow())
    assert isinstance(out, tuple)
    return out[0]


@pytest.fixture
def spot() -> Notice:
    return notice("ec2", "aws/eventbridge-spot-interruption-warning.json")


@pytest.fixture
def exported() -> Iterator[tuple[trace.Tracer, InMemorySpanExporter]]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    yield provider.get_tracer("test"), memory
    provider.shutdown()


def named(memory: InMemorySpanExporter, name: str) -> ReadableSpan:
    (span,) = [s for s in memory.get_finished_spans() if s.name == name]
    return span


# --- attributes ---------------------------------------------------------------------------


def test_spot_notice_attributes(spot: Notice) -> None:
    a = tracing.notice_attributes(spot, cluster="prod-1")
    assert a["host.id"] == "i-1234567890abcdef0"  # the join key to billing
    assert a["cloud.provider"] == "aws" and a["cloud.platform"] == "aws_ec2"
    assert a["cloud.region"] == "us-east-2" and a["cloud.availability_zone"] == "us-east-2a"
    assert a["cloud.account.id"] == "123456789012"
    assert (
        a["cloud.resource_id"] == "arn:aws:ec2:us-east-2:123456789012:instance/i-1234567890abcdef0"
    )
    assert a["k8s.cluster.name"] == "prod-1"
    assert a["messaging.system"] == "aws_sqs" and a["messaging.operation.type"] == "process"
    assert a["reclaimd.notice.id"] == spot.id and a["reclaimd.window_s"] == 120.0
    assert a["reclaimd.notice.issued_at"] == "2025-01-01T12:00:00Z"
    assert all(v != "" for v in a.values())  # absent rather than empty
    assert tracing.notice_kind(spot) is trace.SpanKind.CONSUMER


def test_gce_preemption_attributes() -> None:
    n = notice("gke", "gcp/preempted-logentry.json")
    a = tracing.notice_attributes(n)
    assert a["cloud.provider"] == "gcp" and a["cloud.platform"] == "gcp_compute_engine"
    assert a["host.id"] == "1844488190123456789"  # GCE's numeric instance id
    assert a["cloud.account.id"] == "example-project"
    assert a["k8s.node.name"] == "gke-train-cluster-spot-a100-5b909138-nr65"
    assert a["messaging.system"] == "gcp_pubsub"
    assert "cloud.resource_id" not in a and "k8s.cluster.name" not in a


def test_kueue_reclaim_attributes() -> None:
    n = notice("kueue", "kueue/workload-v1beta2-reclaim-preempted-t0-evicted.json")
    a = tracing.notice_attributes(n)
    assert a["k8s.namespace.name"] == "team-b"
    assert a["reclaimd.workload.name"] == "job-train-b-f1c5a"
    assert a["reclaimd.transport"] == "kubernetes_watch"
    assert not any(k.startswith(("cloud.", "messaging.", "host.")) for k in a)
    assert tracing.notice_kind(n) is trace.SpanKind.INTERNAL


@pytest.mark.parametrize(
    ("source", "provider", "messaging", "transport"),
    [
        ("aws.ec2.spot", "aws", "aws_sqs", ""),
        ("aws.autoscaling", "aws", "aws_sqs", ""),
        ("aws.imds.spot", "aws", "", "imds"),
        ("gcp.compute.preempted", "gcp", "gcp_pubsub", ""),
        ("gcp.metadata.preempted", "gcp", "", "gce_metadata"),
        ("kueue.workload", "", "", "kubernetes_watch"),
        ("kafka://drills/us-east-2", "", "kafka", ""),  # kafka: + the CloudEvent's source
        ("something.else", "", "", ""),
    ],
)
def test_origin_of_each_source(source: str, provider: str, messaging: str, transport: str) -> None:
    o = tracing.origin_of(source)
    assert (o.provider, o.messaging, o.transport) == (provider, messaging, transport)


# --- the root span ------------------------------------------------------------------------


def test_notice_span_starts_at_receipt_with_links_and_the_issue_event(
    spot: Notice, exported: tuple[trace.Tracer, InMemorySpanExporter]
) -> None:
    tracer, memory = exported
    n = replace(spot, attributes=frozen_map({**spot.attributes, "traceparent": PRODUCER}))
    receipt = tracer.start_span("receive q")
    receipt.end()
    with (
        tracing.notice_span(tracer, n, cluster="c", receipt=receipt.get_span_context()),
        tracer.start_as_current_span("reclaimd.claim"),
    ):
        pass
    root = named(memory, "reclaimd.notice")
    assert root.kind is trace.SpanKind.CONSUMER
    assert root.start_time == tracing.ns(n.received_at)
    assert [(e.name, e.timestamp) for e in root.events] == [
        ("reclaimd.notice.issued", tracing.ns(n.issued_at))
    ]
    links = {lk.attributes[tracing.LINK_KIND]: lk.context for lk in root.links if lk.attributes}
    assert links["receive"] == receipt.get_span_context()
    assert f"{links['producer'].trace_id:032x}" == "4bf92f3577b34da6a3ce929d0e0e4736"
    claim = named(memory, "reclaimd.claim")
    assert claim.parent is not None and claim.parent.span_id == root.context.span_id


def test_an_error_is_recorded_on_the_root(
    spot: Notice, exported: tuple[trace.Tracer, InMemorySpanExporter]
) -> None:
    tracer, memory = exported
    with pytest.raises(RuntimeError), tracing.notice_span(tracer, spot):
        raise RuntimeError("apiserver down")
    root = named(memory, "reclaimd.notice")
    assert root.status.status_code is trace.StatusCode.ERROR
    assert [e.name for e in root.events] == ["reclaimd.notice.issued", "exception"]
    assert root.events[1].attributes is not None
    assert root.events[1].attributes["exception.message"] == "apiserver down"


def test_a_bad_traceparent_links_nothing() -> None:
    assert tracing.link_from("") == []
    assert tracing.link_from("00-not-a-traceparent-01") == []
    assert tracing.link_from("00-" + "0" * 32 + "-" + "0" * 16 + "-01") == []  # invalid ids
    assert tracing.context_of(PRODUCER) is not None


def test_producer_attributes() -> None:
    a = tracing.producer_attributes("kafka", "reclaimd.restart-waste", 3)
    assert a == {
        "messaging.system": "kafka",
        "messaging.operation.type": "create",
        "messaging.operation.name": "create",
        "messaging.batch.message_count": 3,
        "messaging.destination.name": "reclaimd.restart-waste",
    }


# --- receive spans ------------------------------------------------------------------------


def test_receipts_one_span_per_delivery_each_with_its_context(
    spot: Notice, exported: tuple[trace.Tracer, InMemorySpanExporter]
) -> None:
    tracer, memory = exported
    receipts = tracing.Receipts(tracer, destinations={"aws_sqs": "spot-queue"})
    n = replace(spot, attributes=frozen_map({**spot.attributes, "traceparent": PRODUCER}))
    first = receipts.on_admission(n, "claimed")
    again = receipts.on_admission(
        replace(n, received_at=n.received_at + timedelta(seconds=5)), "duplicate"
    )
    spans = memory.get_finished_spans()
    # The context handed back is the span's own: the intake carries it to the root span.
    assert [first, again] == [sp.get_span_context() for sp in spans]
    assert [s.name for s in spans] == ["receive spot-queue", "receive spot-queue"]
    assert [s.attributes["reclaimd.admission"] for s in spans if s.attributes] == [
        "claimed",
        "duplicate",
    ]
    s = spans[0]
    assert s.kind is trace.SpanKind.CLIENT and s.parent is None
    assert s.attributes is not None
    assert s.attributes["messaging.destination.name"] == "spot-queue"
    assert s.attributes["messaging.operation.type"] == "receive"
    assert s.start_time == tracing.ns(n.received_at)
    assert [f"{lk.context.trace_id:032x}" for lk in s.links] == [PRODUCER.split("-")[1]]


def test_receipts_of_a_watch(
    exported: tuple[trace.Tracer, InMemorySpanExporter],
) -> None:
    tracer, memory = exported
    n = notice("kueue", "kueue/workload-v1beta2-reclaim-preempted-t0-evicted.json")
    receipts = tracing.Receipts(tracer)
    receipts.on_admission(n, "claimed")
    assert {s.name for s in memory.get_finished_spans()} == {tracing.RECEIVE_SPAN}
    attrs = memory.get_finished_spans()[0].attributes
    assert attrs is not None and attrs["reclaimd.transport"] == "kubernetes_watch"


def test_pubsub_receipts_name_the_subscription(
    exported: tuple[trace.Tracer, InMemorySpanExporter],
) -> None:
    tracer, memory = exported
    receipts = tracing.Receipts(tracer, destinations={"gcp_pubsub": "preemptions"})
    receipts.on_admission(notice("gke", "gcp/preempted-logentry.json"), "claimed")
    (s,) = memory.get_finished_spans()
    assert s.attributes is not None
    assert s.attributes["messaging.destination.subscription.name"] == "preemptions"


# --- export -------------------------------------------------------------------------------


def test_json_lines_round_trip_through_the_postmortem_reader(tmp_path: Path, spot: Notice) -> None:
    path = tmp_path / "spans.jsonl"
    provider = tracing.setup(service="t", span_file=path, synchronous=True)
    tracer = provider.get_tracer(tracing.TRACER_NAME)
    n = replace(spot, attributes=frozen_map({**spot.attributes, "traceparent": PRODUCER}))
    with tracing.notice_span(tracer, n), tracer.start_as_current_span("reclaimd.evict") as s:
        s.set_status(trace.StatusCode.ERROR, "blocked")
    provider.shutdown()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    evict, root = lines
    assert root["kind"] == "CONSUMER" and evict["kind"] == "INTERNAL"
    assert evict["status"] == "ERROR" and evict["status_message"] == "blocked"
    assert root["links"][0]["attributes"] == {tracing.LINK_KIND: "producer"}
    t = postmortem.load(path, spot.id)
    assert [(r.step, r.ok, r.detail) for r in t.rows] == [("evict", False, "blocked")]
    assert t.receipt_lag_s is not None and t.receipt_lag_s > 0  # the fixture is from 2025


def test_resource_names_the_process(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment.name=test")
    provider = tracing.setup(
        service="reclaimd",
        span_file=tmp_path / "s.jsonl",
        resource_attributes={"k8s.cluster.name": "c1", "service.instance.id": "r-0"},
    )
    a = provider.resource.attributes
    assert a["service.name"] == "reclaimd" and a["k8s.cluster.name"] == "c1"
    assert a["service.instance.id"] == "r-0" and a["deployment.environment.name"] == "test"
    assert provider.resource.schema_url == tracing.SCHEMA_URL
    provider.shutdown()


@pytest.mark.parametrize(
    ("env", "protocol"),
    [
        ({}, None),
        ({"OTEL_SERVICE_NAME": "x"}, None),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}, "grpc"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, "http/protobuf"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "http/protobuf"),
        (
            {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http"},
            "http/protobuf",
        ),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, "grpc"),
        # Another signal's own variables do not turn trace export on.
        ({"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://c:4317"}, None),
        ({"OTEL_EXPORTER_OTLP_LOGS_PROTOCOL": "http/protobuf"}, None),
        (
            {"OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_HEADERS": "a=b"},
            "grpc",
        ),
    ],
)
def test_export_choice(env: dict[str, str], protocol: str | None) -> None:
    assert tracing.otlp_protocol(env) == protocol


def test_without_otel_variables_spans_go_to_the_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for key in [k for k in os.environ if k.startswith("OTEL_EXPORTER_OTLP_")]:
        monkeypatch.delenv(key)
    path = tmp_path / "spans.jsonl"
    provider = tracing.setup(service="t", span_file=path, synchronous=True)
    with provider.get_tracer("t").start_as_current_span("x"):
        pass
    provider.shutdown()
    assert json.loads(path.read_text())["name"] == "x"
