"""Every parser, any input: a Notice tuple, Ignored, or a one-line ParseError, nothing else.

Three kinds of input per parser: random bytes, random JSON shapes, and the real fixtures
with a few random edits (a value replaced by a random or a tricky one, a key dropped or
added). The last reaches the deep branches that random shapes never get to. Whatever comes
out must also be a notice the rest of reclaimd can use: storable and read back unchanged
(a claim stores ``to_json``), with string attributes, aware times and a target.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from shared_fixtures import FIXTURES as SHARED

from reclaimd.handlers import PARSERS, Parser
from reclaimd.model import Ignored, Notice, ParseError, Response, Target, Windows, digest

FIXTURES = SHARED
RECEIVED = datetime(2025, 9, 16, 12, 0, tzinfo=UTC)
FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def load(*parts: str) -> Any:
    return json.loads(FIXTURES.joinpath(*parts).read_text())


def _imds(path: str, body: Any) -> dict[str, Any]:
    return {
        "instance_id": "i-1234567890abcdef0",
        "path": path,
        "body": body,
        "zone": "us-east-2a",
        "region": "us-east-2",
    }


def text(*parts: str) -> str:
    return FIXTURES.joinpath(*parts).read_text()


def _meta(path: str, value: str) -> dict[str, Any]:
    return {
        "instance": "gke-train-cluster-spot-a100-5b909138-nr65",
        "project": "example-project",
        "zone": "us-central1-a",
        "path": path,
        "value": value,
        "etag": "9d2f61b0ac3e47e1",
        "observed_at": "2025-09-16T10:42:01Z",
    }


AZURE = Path(__file__).resolve().parents[1] / "fixtures" / "azure"  # this repo's own
_AKS_VM = "aks-spotgpu-12345678-vmss_3"


def _azure(document: str, vm: str = _AKS_VM) -> dict[str, Any]:
    """The Azure poller's envelope (handlers/README.md) around a public-doc document."""
    body = {
        "vm_name": vm,
        "node_name": "aks-spotgpu-12345678-vmss000003",
        "vm_size": "Standard_ND96isr_H100_v5",
        "priority": "Spot",
        "location": "eastus",
        "zone": "1",
        "document": json.loads(AZURE.joinpath(document).read_text()),
    }
    if vm == _AKS_VM:
        body["resource_id"] = (
            "/subscriptions/8d1a5e3c-0f1b-4c2a-9e7d-2b6f4a1c9e00/resourceGroups"
            "/MC_gpu-rg_train-aks_eastus/providers/Microsoft.Compute/virtualMachineScaleSets"
            "/aks-spotgpu-12345678-vmss/virtualMachines/3"
        )
    return body


_CLOUD_EVENT = {
    "specversion": "1.0",
    "id": "e-42",
    "source": "//drills/us-east-2",
    "type": "io.reclaimd.notice.maintenance.v1",
    "time": "2025-01-01T12:00:00Z",
    "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "data": {
        "target": {"node_name": "n1", "workload": {"namespace": "ns", "name": "wl"}},
        "deadline": "2025-01-01T12:01:00Z",
        "response": "checkpoint_only",
        "attributes": {"region": "us-east-2"},
    },
}

SEEDS: dict[str, list[Any]] = {
    "sqs": [
        load("aws", name)
        for name in (
            "eventbridge-spot-interruption-warning.json",
            "eventbridge-rebalance-recommendation.json",
            "eventbridge-instance-state-change.json",
            "eventbridge-health-scheduled-change.json",
            "eventbridge-asg-terminate-lifecycle-action.json",
            "asg-terminate-lifecycle-direct-sqs.json",
            "asg-test-notification-direct-sqs.json",
        )
    ],
    "imds": [
        _imds("spot/instance-action", text("aws", "imds-spot-instance-action.json")),
        _imds(
            "events/recommendations/rebalance", text("aws", "imds-rebalance-recommendation.json")
        ),
        _imds("events/maintenance/scheduled", text("aws", "imds-scheduled-events.json")),
        _imds("autoscaling/target-lifecycle-state", "Terminated"),
        # Decoded bodies let the edits reach inside them.
        _imds("spot/instance-action", load("aws", "imds-spot-instance-action.json")),
        _imds("events/maintenance/scheduled", load("aws", "imds-scheduled-events.json")),
    ],
    "pubsub": [
        load("gcp", name)
        for name in (
            "preempted-logentry.json",
            "terminate-on-host-maintenance-logentry.json",
            "migrate-on-host-maintenance-logentry.json",
            "preempted-pubsub-pull-response.json",
            "preempted-pubsub-push-envelope.json",
        )
    ],
    "gce_metadata": [
        _meta("instance/preempted", "TRUE"),
        _meta("instance/maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE"),
        _meta("instance/maintenance-event", "NONE"),
    ],
    "azure_scheduled": [
        _azure("scheduledevents-preempt-aks-spot.json"),
        _azure("scheduledevents-terminate-vmss.json", "nsgvmss_85"),
        _azure("scheduledevents-reboot-user.json", "flatcar-vm1"),
        _azure("scheduledevents-freeze-started.json", "WestNO_0"),
    ],
    "kueue": [
        load("kueue", name)
        for name in (
            "workload-v1beta2-reclaim-preempted-t0-evicted.json",
            "workload-v1beta1-reclaim-preempted-t0-evicted.json",
            "workload-v1beta2-reclaim-preempted-t1-requeued.json",
        )
    ]
    + [
        {
            "type": "MODIFIED",
            "object": load("kueue", "workload-v1beta2-reclaim-preempted-t0-evicted.json"),
        }
    ],
    "kafka_notices": [
        _CLOUD_EVENT,
        {**_CLOUD_EVENT, "type": "io.reclaimd.notice.rebalance_recommendation.v1"},
    ],
}

# Values that sit on the edges the parsers must handle: times at the ends of the range,
# zone-less times, the other time format, lone surrogates, huge numbers and strings, and
# the literal values the parsers branch on.
TRICKY: st.SearchStrategy[Any] = st.sampled_from(
    [
        "",
        " ",
        "TRUE",
        "FALSE",
        "NONE",
        "True",
        "active",
        "Preempted",
        "Evicted",
        "Notification",
        "9999-12-31T23:59:59Z",
        "0001-01-01T00:00:00+01:00",
        "1969-12-31T23:59:59Z",
        "2025-01-01T00:00:00",
        "2025-01-01T00:00:00.123456789-23:59",
        "31 Feb 2025 00:00:00 GMT",
        "Wed, 15 Jan 2025 12:00:00 GMT",
        "\ud800",
        "i-\udfff",
        "x" * 3000,
        "projects/p/zones/z/instances/",
        "projects/p/zones/z/instances/a/b",
        "arn:aws:ec2:us-east-2a:instance/i-1234567890abcdef0",
        "autoscaling:EC2_INSTANCE_TERMINATING",
        "autoscaling:TEST_NOTIFICATION",
        "compute.instances.preempted",
        1e308,
        float("inf"),
        float("nan"),
        -1,
        2**70,
        True,
        None,
        [],
        {},
        [[[]]],
    ]
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _keys(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _keys(item)
    elif isinstance(value, list):
        for item in value:
            yield from _keys(item)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _paths(item, (*prefix, i))


@st.composite
def edited(draw: st.DrawFn, source: str) -> bytes:
    seeds = SEEDS[source]
    vocabulary = sorted({k for seed in seeds for k in _keys(seed)})
    doc = copy.deepcopy(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(list(_paths(doc))))
        value = copy.deepcopy(draw(TRICKY | JSON))  # TRICKY holds shared [] and {}
        op = draw(st.sampled_from(["set", "drop", "add"]))
        if not path:
            doc = value if op == "set" else doc
            continue
        parent = doc
        for step in path[:-1]:
            parent = parent[step]
        node = parent[path[-1]]
        if op == "set":
            parent[path[-1]] = value
        elif op == "drop":
            del parent[path[-1]]
        elif isinstance(node, dict):
            node[draw(st.sampled_from(vocabulary))] = value
    if source == "pubsub" and isinstance(doc, dict) and draw(st.booleans()):
        # Wrap an edited LogEntry as Pub/Sub would, so edits reach inside the envelope too.
        data = base64.b64encode(json.dumps(doc).encode()).decode()
        doc = {"receivedMessages": [{"ackId": "1", "message": {"data": data}}]}
    return json.dumps(doc).encode()


def check(parser: Parser, payload: bytes) -> None:
    """The whole contract for one input."""
    try:
        out = parser(payload, received_at=RECEIVED, windows=Windows())
    except ParseError as e:
        assert str(e) and "\n" not in str(e)
        return
    if isinstance(out, Ignored):
        assert out.reason and "\n" not in out.reason
        return
    assert isinstance(out, tuple) and out
    assert len({n.id for n in out}) == len(out)
    for notice in out:
        assert isinstance(notice, Notice)
        assert notice.target != Target()
        assert notice.payload_digest == digest(payload)
        assert notice.received_at == RECEIVED
        assert notice.issued_at.tzinfo is not None
        assert notice.deadline is None or notice.deadline.tzinfo is not None
        # Only an early warning may come without a deadline.
        assert notice.deadline is not None or notice.response is Response.CHECKPOINT_ONLY
        assert all(isinstance(v, str) and v for v in notice.attributes.values())
        stored = json.loads(json.dumps(notice.to_json()))
        assert Notice.from_json(stored) == notice


SOURCES = sorted(PARSERS)


@pytest.mark.parametrize("source", SOURCES)
def test_seeds_are_well_formed(source: str) -> None:
    # The edits start from inputs that parse, so the fuzz explores around real payloads.
    for seed in SEEDS[source]:
        out = PARSERS[source](json.dumps(seed).encode(), received_at=RECEIVED, windows=Windows())
        assert isinstance(out, tuple | Ignored)
        check(PARSERS[source], json.dumps(seed).encode())


@pytest.mark.parametrize("source", SOURCES)
@FUZZ
@given(payload=st.binary(max_size=256))
def test_random_bytes(source: str, payload: bytes) -> None:
    check(PARSERS[source], payload)


@pytest.mark.parametrize("source", SOURCES)
@FUZZ
@given(
    shape=JSON
    | st.dictionaries(
        st.sampled_from(
            [
                "data",
                "message",
                "detail",
                "object",
                "path",
                "body",
                "status",
                "receivedMessages",
                "detail-type",
                "type",
            ]
        ),
        JSON,
        max_size=6,
    )
)
def test_random_json_shapes(source: str, shape: Any) -> None:
    check(PARSERS[source], json.dumps(shape).encode())


@pytest.mark.parametrize("source", SOURCES)
@FUZZ
@given(data=st.data())
def test_edited_fixtures(source: str, data: st.DataObject) -> None:
    check(PARSERS[source], data.draw(edited(source)))


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize(
    "payload",
    [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
        "\ufeff{}".encode(),
        json.dumps({"x": "\ud800"}).encode(),
        b"NaN",
        b"1" * 5000,
    ],
    ids=["deep-list", "deep-object", "bom", "surrogate", "nan", "huge-int"],
)
def test_pathological_payloads(source: str, payload: bytes) -> None:
    check(PARSERS[source], payload)
