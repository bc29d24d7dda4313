"""Seeded hostile payloads for every source: what ``make bench-fuzz`` sends and a unit test parses.

Each payload starts from a real shape (the public samples in shared/fixtures and, for Azure,
tests/fixtures/azure, trimmed) and is broken one way: truncated JSON, a huge body, deep nesting,
a value of the wrong type, control and bidi characters, lone surrogates, identifiers that break
their provider's grammar, path traversal, SSRF-looking URLs, duplicate keys, NaN and 400-digit
numbers, invalid UTF-8, a key dropped or added. Some survive as well-formed notices for
instances that do not exist (or are long expired): those must be counted and acked like the
rest, never acted on.

Pure and deterministic: the same ``random.Random`` seed gives the same bytes. Identifiers in the
base shapes are well-formed but name nothing in any cluster (``i-0f0f...``, ``fuzz-vm-0``,
``fuzz-vmss_0``), so a payload that parses cleanly can only be an unknown target.
"""

from __future__ import annotations

import base64
import copy
import json
import random
from collections.abc import Callable
from typing import Any

SOURCES = ("ec2", "gke", "kafka", "kueue", "imds", "gce-metadata", "azure-scheduled")
HUGE_BYTES = 200_000  # under SQS's 256 KiB, Kafka's 1 MiB and Pub/Sub's 10 MB

# Values that must never steer reclaimd, whatever field they land in.
HOSTILE_VALUES: tuple[Any, ...] = (
    "../../../etc/passwd",
    "i-../../x",
    "%2e%2e%2f%2e%2e%2fsecret",
    "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
    "http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/",
    "file:///etc/shadow",
    "gopher://127.0.0.1:6379/_FLUSHALL",
    "http://{pod_ip}@evil.example/",
    "n1,metadata.name!=x",
    "spec.unschedulable=true",
    "a\nb\r\nInjected: header",
    "\u0000\u0001\u001b[31m",
    "\u202egnp.exe",
    "\ud800",
    "\udfff\ud800",
    "\ufeffi-1234567890abcdef0",
    "💥" * 64,
    "I-0ABC1234",
    "i-1234567890abcdef",
    "Node_Name",
    "UPPER.case",
    "-leading",
    "",
    " ",
    "TRUE ",
    "x" * 300,
    -1,
    0,
    1e308,
    -(2**63),
    2**64,
    True,
    None,
    [],
    {},
    [[["deep"]]],
    {"$ref": "#"},
)

_SPOT = {
    "version": "0",
    "id": "0f0f0f0f-fuzz-4000-8000-000000000001",
    "detail-type": "EC2 Spot Instance Interruption Warning",
    "source": "aws.ec2",
    "account": "123456789012",
    "time": "2025-09-16T11:58:00Z",
    "region": "us-east-2",
    "resources": ["arn:aws:ec2:us-east-2a:instance/i-0f0f0f0f0f0f0f0f0"],
    "detail": {"instance-id": "i-0f0f0f0f0f0f0f0f0", "instance-action": "terminate"},
}
_LIFECYCLE = {
    "Origin": "AutoScalingGroup",
    "LifecycleHookName": "fuzz-hook",
    "Service": "AWS Auto Scaling",
    "AccountId": "123456789012",
    "LifecycleTransition": "autoscaling:EC2_INSTANCE_TERMINATING",
    "AutoScalingGroupName": "fuzz-asg",
    "Time": "2025-09-16T11:58:00.000Z",
    "EC2InstanceId": "i-0f0f0f0f0f0f0f0f1",
    "LifecycleActionToken": "0f0f0f0f-0000-4000-8000-00000000f022",
}
_HEALTH = {
    "version": "0",
    "id": "0f0f0f0f-fuzz-4000-8000-000000000003",
    "detail-type": "AWS Health Event",
    "source": "aws.health",
    "account": "123456789012",
    "time": "2025-09-16T11:58:00Z",
    "region": "us-east-2",
    "resources": ["i-0f0f0f0f0f0f0f0f2"],
    "detail": {
        "eventArn": "arn:aws:health:us-east-2::event/EC2/fuzz",
        "service": "EC2",
        "eventTypeCode": "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED",
        "eventTypeCategory": "scheduledChange",
        "startTime": "Tue, 16 Sep 2025 12:30:00 GMT",
        "affectedEntities": [{"entityValue": "i-0f0f0f0f0f0f0f0f2"}],
    },
}
_LOG_ENTRY = {
    "protoPayload": {
        "@type": "type.googleapis.com/google.cloud.audit.AuditLog",
        "methodName": "compute.instances.preempted",
        "resourceName": "projects/fuzz-project/zones/us-central1-a/instances/fuzz-vm-0",
        "status": {"message": "Instance was preempted."},
    },
    "insertId": "fuzz0001",
    "resource": {"type": "gce_instance", "labels": {"instance_id": "1844488190123456789"}},
    "timestamp": "2025-09-16T11:58:00.000Z",
    "operation": {"id": "systemevent-fuzz-0001", "producer": "compute.instances.preempted"},
}
_CLOUDEVENT = {
    "specversion": "1.0",
    "id": "fuzz-0001",
    "source": "//fuzz/us-east-2",
    "type": "io.reclaimd.notice.spot_interruption.v1",
    "time": "2025-09-16T11:58:00Z",
    "datacontenttype": "application/json",
    "data": {
        "target": {"node_name": "fuzz-node-0", "instance_id": "i-0f0f0f0f0f0f0f0f3"},
        "attributes": {"region": "us-east-2"},
    },
}
_WORKLOAD = {
    "apiVersion": "kueue.x-k8s.io/v1beta2",
    "kind": "Workload",
    "metadata": {"name": "fuzz-wl-0", "namespace": "fuzz-ns", "uid": "0f0f0f0f-0000-fuzz"},
    "spec": {"queueName": "fuzz-lq", "podSets": [{"name": "main", "count": 1}]},
    "status": {
        "conditions": [
            {
                "type": "Evicted",
                "status": "True",
                "reason": "Preempted",
                "message": "Preempted to accommodate a workload (UID: a, JobUID: b)",
                "lastTransitionTime": "2025-09-16T11:58:00Z",
            }
        ]
    },
}
_IMDS = {
    "instance_id": "i-0f0f0f0f0f0f0f0f4",
    "path": "spot/instance-action",
    "body": '{"action": "terminate", "time": "2025-09-16T12:00:00Z"}',
    "zone": "us-east-2a",
    "region": "us-east-2",
    "instance_type": "p5.48xlarge",
}
_METADATA = {
    "instance": "fuzz-vm-1",
    "project": "fuzz-project",
    "zone": "us-central1-a",
    "path": "instance/preempted",
    "value": "TRUE",
    "etag": "0f0f0f0f",
}

# Azure Scheduled Events (api-version 2020-07-01): the documented example documents' shapes
# (tests/fixtures/azure/), their events aimed at a scale-set instance that names nothing.
AZURE_VM = "fuzz-vmss_0"
_AZURE_OTHERS = ["fuzz-vmss_1", "fuzz-vmss_2"]  # the placement group's other instances
_AZURE_FREEZE: dict[str, Any] = {
    "EventId": "C7061BAC-AFDC-4513-B24B-AA5F13A16123",
    "EventStatus": "Scheduled",
    "EventType": "Freeze",
    "ResourceType": "VirtualMachine",
    "Resources": [AZURE_VM, *_AZURE_OTHERS],
    "NotBefore": "Tue, 16 Sep 2025 12:15:00 GMT",
    "Description": "Virtual machine is being paused because of a memory-preserving Live "
    "Migration operation.",
    "EventSource": "Platform",
    "DurationInSeconds": 5,
}
_AZURE_DOCUMENTS: tuple[dict[str, Any], ...] = (
    {  # a Spot eviction (AKS), beside a Freeze for two other instances of the group
        "DocumentIncarnation": 7,
        "Events": [
            {
                "EventId": "5DD55B64-45AD-49D3-BBC9-F57D4EA97BD7",
                "EventStatus": "Scheduled",
                "EventType": "Preempt",
                "ResourceType": "VirtualMachine",
                "Resources": [AZURE_VM],
                "NotBefore": "Tue, 16 Sep 2025 12:00:30 GMT",
                "Description": "",
                "EventSource": "Platform",
                "DurationInSeconds": -1,
            },
            {**_AZURE_FREEZE, "Resources": list(_AZURE_OTHERS)},
        ],
    },
    {  # a scale-set delete with terminate notification: only the fields its docs page shows
        "DocumentIncarnation": 4,
        "Events": [
            {
                "EventId": "f020ba2e-3bc0-4c40-a10b-86575a9eabd5",
                "EventType": "Terminate",
                "ResourceType": "VirtualMachine",
                "Resources": [AZURE_VM],
                "EventStatus": "Scheduled",
                "NotBefore": "Tue, 16 Sep 2025 12:05:00 GMT",
            }
        ],
    },
    {  # a user-initiated Reboot
        "DocumentIncarnation": 2,
        "Events": [
            {
                "EventId": "4CAEA225-A741-474D-A72E-428C86FCD853",
                "EventStatus": "Scheduled",
                "EventType": "Reboot",
                "ResourceType": "VirtualMachine",
                "Resources": [AZURE_VM],
                "NotBefore": "Tue, 16 Sep 2025 12:15:00 GMT",
                "Description": "",
                "EventSource": "User",
                "DurationInSeconds": -1,
            }
        ],
    },
    {  # a platform Redeploy of two instances (one event, several resources: not approvable)
        "DocumentIncarnation": 5,
        "Events": [
            {
                "EventId": "602d9444-d2cd-49c7-8624-8643e7171297",
                "EventStatus": "Scheduled",
                "EventType": "Redeploy",
                "ResourceType": "VirtualMachine",
                "Resources": [AZURE_VM, _AZURE_OTHERS[0]],
                "NotBefore": "Tue, 16 Sep 2025 12:10:00 GMT",
                "Description": "Host server is undergoing maintenance.",
                "EventSource": "Platform",
                "DurationInSeconds": -1,
            }
        ],
    },
    {"DocumentIncarnation": 2, "Events": [_AZURE_FREEZE]},  # a live migration's pause
    {  # the same Freeze once started: NotBefore blank
        "DocumentIncarnation": 3,
        "Events": [{**copy.deepcopy(_AZURE_FREEZE), "EventStatus": "Started", "NotBefore": ""}],
    },
    {"DocumentIncarnation": 1, "Events": []},  # nothing scheduled
)
# The per-node poller's envelope: this VM's compute metadata around the document.
_AZURE_ENVELOPE = {
    "vm_name": AZURE_VM,
    "resource_id": "/subscriptions/0f0f0f0f-0000-4000-8000-00000000f0f0/resourceGroups/"
    "MC_fuzz-rg_fuzz-aks_eastus/providers/Microsoft.Compute/virtualMachineScaleSets/fuzz-vmss/"
    "virtualMachines/0",
    "node_name": "fuzz-vmss000000",
    "vm_size": "Standard_ND96isr_H100_v5",
    "priority": "Spot",
    "location": "eastus",
    "zone": "1",
}


def _pubsub(entry: Any) -> dict[str, Any]:
    data = base64.b64encode(json.dumps(entry).encode()).decode()
    return {"message": {"data": data, "messageId": "1", "attributes": {}}}


def bases(source: str) -> list[Any]:
    """The real shapes a source's hostile payloads start from (deep copies)."""
    shapes: dict[str, list[Any]] = {
        "ec2": [_SPOT, _LIFECYCLE, _HEALTH, {"Type": "Notification", "Message": json.dumps(_SPOT)}],
        "gke": [_LOG_ENTRY, _pubsub(_LOG_ENTRY), {"receivedMessages": [_pubsub(_LOG_ENTRY)]}],
        "kafka": [_CLOUDEVENT],
        "kueue": [_WORKLOAD, {"type": "MODIFIED", "object": _WORKLOAD}],
        "imds": [_IMDS, {**_IMDS, "path": "events/maintenance/scheduled", "body": "[]"}],
        "gce-metadata": [_METADATA],
        "azure-scheduled": [{**_AZURE_ENVELOPE, "document": d} for d in _AZURE_DOCUMENTS],
    }
    return copy.deepcopy(shapes[source])


def _slots(doc: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside ``doc``."""
    found: list[tuple[Any, ...]] = []
    if isinstance(doc, dict):
        for k, v in doc.items():
            found.append((*at, k))
            found.extend(_slots(v, (*at, k)))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            found.append((*at, i))
            found.extend(_slots(v, (*at, i)))
    return found


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return doc


def _drop(doc: Any, path: tuple[Any, ...]) -> Any:
    node = doc
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return doc


def _dumps(doc: Any) -> bytes:
    # ensure_ascii: a lone surrogate travels as a \ud800 escape, as a hostile producer writes it
    return json.dumps(doc).encode()


def _wrong_value(rng: random.Random, doc: Any) -> bytes:
    slots = _slots(doc)
    if slots:
        _set(doc, rng.choice(slots), rng.choice(HOSTILE_VALUES))
    return _dumps(doc)


def _ident_value(rng: random.Random, doc: Any) -> bytes:
    # Aim at the fields that are identifiers: the leaves whose values are strings.
    slots = [p for p in _slots(doc) if isinstance(_get(doc, p), str)]
    if slots:
        value = rng.choice([v for v in HOSTILE_VALUES if isinstance(v, str)])
        _set(doc, rng.choice(slots), value)
    return _dumps(doc)


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        doc = doc[key]
    return doc


def _drop_key(rng: random.Random, doc: Any) -> bytes:
    slots = _slots(doc)
    if slots:
        _drop(doc, rng.choice(slots))
    return _dumps(doc)


def _extra_key(rng: random.Random, doc: Any) -> bytes:
    targets = [p for p in _slots(doc) if isinstance(_get(doc, p), dict)]
    node = _get(doc, rng.choice(targets)) if targets else doc
    if isinstance(node, dict):
        node[rng.choice(["__proto__", "constructor", "../x", "\u0000", "a" * 500])] = rng.choice(
            HOSTILE_VALUES
        )
    return _dumps(doc)


def _truncate(rng: random.Random, doc: Any) -> bytes:
    raw = _dumps(doc)
    return raw[: rng.randrange(0, max(1, len(raw)))]


def _huge(rng: random.Random, doc: Any) -> bytes:
    slots = [p for p in _slots(doc) if isinstance(_get(doc, p), str)] or [()]
    filler = rng.choice(["A", "\u00e9", "💥", "\\", '"'])
    value = filler * (HUGE_BYTES // max(1, len(filler.encode())) // 2)
    if slots == [()]:
        return _dumps({"huge": value})
    return _dumps(_set(doc, rng.choice(slots), value))


def _deep(rng: random.Random, doc: Any) -> bytes:
    depth = rng.choice([64, 1_000, 20_000, 100_000])
    opener, closer = rng.choice([("[", "]"), ('{"a":', "}")])
    return (opener * depth + "1" + closer * depth).encode()


def _duplicate_keys(rng: random.Random, doc: Any) -> bytes:
    # JSON allows repeated keys and parsers disagree on which wins; the last does in Python.
    raw = _dumps(doc).decode()
    if isinstance(doc, dict) and doc:
        key = rng.choice(list(doc))
        value = json.dumps(rng.choice(HOSTILE_VALUES))
        raw = "{" + json.dumps(key) + ":" + value + "," + raw[1:]
        if rng.random() < 0.5:
            raw = raw[:-1] + "," + json.dumps(key) + ":" + value + "}"
    return raw.encode()


def _not_json(rng: random.Random, doc: Any) -> bytes:
    return rng.choice(
        [
            b"",
            b" ",
            b"null",
            b"[]",
            b'"a string"',
            b"\xef\xbb\xbf{}",
            b"<xml/>",
            b"NaN",
            b"{'single': 'quotes'}",
            bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))),
        ]
    )


def _bad_utf8(rng: random.Random, doc: Any) -> bytes:
    raw = _dumps(doc)
    cut = rng.randrange(len(raw))
    return (
        raw[:cut] + rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80"]) + raw[cut:]
    )


def _numbers(rng: random.Random, doc: Any) -> bytes:
    slots = _slots(doc)
    marker = "__fuzz_number__"
    if slots:
        _set(doc, rng.choice(slots), marker)
    literal = rng.choice(["NaN", "Infinity", "-Infinity", "1e999", "9" * 400, "-0", "1.5e-400"])
    return _dumps(doc).replace(json.dumps(marker).encode(), literal.encode())


MUTATIONS: tuple[Callable[[random.Random, Any], bytes], ...] = (
    _wrong_value,
    _ident_value,
    _ident_value,
    _drop_key,
    _extra_key,
    _truncate,
    _huge,
    _deep,
    _duplicate_keys,
    _not_json,
    _bad_utf8,
    _numbers,
)


def message(source: str, rng: random.Random) -> bytes:
    """One hostile payload as the ``source`` parser receives it."""
    mutate = rng.choice(MUTATIONS)
    if mutate is _huge and rng.random() > 0.05:  # huge bodies are heavy: keep them rare
        mutate = _wrong_value
    doc = rng.choice(bases(source))
    # A Pub/Sub message may also carry its hostility inside the base64 data.
    if source == "gke" and "message" in doc and rng.random() < 0.5:
        inner = mutate(rng, copy.deepcopy(_LOG_ENTRY))
        doc["message"]["data"] = base64.b64encode(inner).decode()
        return _dumps(doc)
    # The Azure poller sends the document as the text it read: its hostility is there.
    if source == "azure-scheduled" and rng.random() < 0.5:
        doc["document"] = _text(mutate(rng, doc["document"]))
        return _dumps(doc)
    return mutate(rng, doc)


def sqs_text(raw: bytes) -> str:
    """``raw`` as an SQS message body can carry it: SQS takes only XML characters (no NUL,
    no C0 controls but tab/LF/CR, no surrogates), so the rest is replaced."""
    text = raw.decode("utf-8", errors="replace")
    allowed = (
        c
        if c in "\t\n\r"
        or "\x20" <= c <= "\ud7ff"
        or "\ue000" <= c <= "\ufffd"
        or c >= "\U00010000"
        else "\ufffd"
        for c in text
    )
    return "".join(allowed) or " "


def imds_body(path: str, rng: random.Random) -> str:
    """A hostile IMDS response body for ``path`` (what the per-node poller wraps)."""
    if path == "events/maintenance/scheduled":
        good: Any = [
            {
                "Code": "system-reboot",
                "EventId": "instance-event-0fuzz",
                "State": "active",
                "NotBefore": "21 Jan 2019 09:00:43 GMT",
            }
        ]
    elif path == "autoscaling/target-lifecycle-state":
        return rng.choice(["InService", "Terminated\x00", "Warmed:Pending", "\u202eTerminated", ""])
    elif path == "events/recommendations/rebalance":
        good = {"noticeTime": "2025-09-16T11:58:00Z"}
    else:
        good = {"action": "terminate", "time": "2025-09-16T12:00:00Z"}
    return _text(rng.choice(MUTATIONS)(rng, good))


def _text(raw: bytes) -> str:
    """``raw`` as an HTTP client reads a UTF-8 body (invalid bytes replaced)."""
    return raw.decode("utf-8", errors="replace")


def scheduled_events_body(rng: random.Random, incarnation: int | None = None) -> str:
    """A hostile Scheduled Events document (``GET /metadata/scheduledevents``), from one of the
    documented shapes. Its events name ``AZURE_VM`` and its neighbours, not the VM a stand-in
    serves it to: what survives parsing is a document of other VMs' events (``Ignored``).
    ``incarnation`` sets ``DocumentIncarnation`` before the mutation: the poller hands over a
    document only when that changes, so a server gives each answer its own."""
    doc = copy.deepcopy(rng.choice(_AZURE_DOCUMENTS))
    if incarnation is not None:
        doc["DocumentIncarnation"] = incarnation
    return _text(rng.choice(MUTATIONS)(rng, doc))


def metadata_value(rng: random.Random) -> str:
    """A hostile value for a GCE metadata key (plain text on the wire)."""
    return rng.choice(
        [
            "TRUE\x00",
            "true",
            "YES",
            "TERMINATE_ON_HOST_MAINTENANCE\x00",
            "MIGRATE_ON_HOST_MAINTENANCE,TERMINATE_ON_HOST_MAINTENANCE",
            "\u202eTRUE",
            "",
            "x" * rng.choice([10, 10_000]),
            json.dumps(rng.choice(HOSTILE_VALUES)),
            "http://169.254.169.254/",
            "../../instance/preempted",
        ]
    )


def workload_status(rng: random.Random) -> dict[str, Any]:
    """Hostile conditions a Workload's status can hold (the apiserver's schema still applies:
    reasons are CamelCase words, messages free text up to 32 KiB)."""
    message_text = rng.choice([v for v in HOSTILE_VALUES if isinstance(v, str)] or ["x"])
    return {
        "conditions": [
            {
                "type": rng.choice(["Evicted", "Preempted", "Evicted", "Finished"]),
                "status": rng.choice(["True", "False", "Unknown"]),
                "reason": rng.choice(
                    ["Preempted", "PodsReadyTimeout", "DeactivatedDueToX", "Fuzz", "InCohortX"]
                ),
                "message": (message_text * rng.choice([1, 50]))[:32_000] or "x",
                "lastTransitionTime": rng.choice(
                    ["2025-09-16T11:58:00Z", "1970-01-01T00:00:00Z", "2999-12-31T23:59:59Z"]
                ),
            }
        ]
    }
