"""GCE/GKE preemption and maintenance: audit LogEntries via Pub/Sub, and the metadata server
(handlers/pubsub/parser.py, handlers/gce_metadata/parser.py)."""

from __future__ import annotations

import base64
import copy
import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from shared_fixtures import FIXTURES as SHARED

from reclaimd.handlers.gce_metadata import parser as gce_metadata
from reclaimd.handlers.pubsub import parser as gke_preemption
from reclaimd.model import (
    Ignored,
    Notice,
    NoticeKind,
    ParseError,
    ParseOutcome,
    Response,
    Target,
    Windows,
    digest,
    frozen_map,
    stable_id,
)

FIXTURES = SHARED / "gcp"
RECEIVED = datetime(2025, 9, 16, 10, 42, 34, tzinfo=UTC)
DEFAULT = Windows()
PROJECT, ZONE = "example-project", "us-central1-a"
SPOT_VM = "gke-train-cluster-spot-a100-5b909138-nr65"
PREEMPT_OP = "systemevent-1758019346116-63ee7a3e1f2b0-5c0d6a1e-9b7f3c21"


def raw(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def doc(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(raw(name))
    return data


def encode(obj: Any) -> bytes:
    return obj if isinstance(obj, bytes) else json.dumps(obj).encode()


def parse(payload: Any, windows: Windows = DEFAULT) -> ParseOutcome:
    return gke_preemption.parse(encode(payload), received_at=RECEIVED, windows=windows)


def notices(payload: Any, windows: Windows = DEFAULT) -> tuple[Notice, ...]:
    out = parse(payload, windows)
    assert isinstance(out, tuple), out
    return out


def one(payload: Any, windows: Windows = DEFAULT) -> Notice:
    (notice,) = notices(payload, windows)
    return notice


def pubsub(entry: dict[str, Any], message_id: str = "1") -> dict[str, Any]:
    data = base64.b64encode(json.dumps(entry).encode()).decode()
    return {"message": {"data": data, "messageId": message_id}}


# --- every fixture, field by field -------------------------------------------------------


def test_preempted_log_entry() -> None:
    payload = raw("preempted-logentry.json")
    timestamp = datetime(2025, 9, 16, 10, 42, 31, 325309, tzinfo=UTC)
    assert one(payload) == Notice(
        id=stable_id("gcp.compute.preempted", PREEMPT_OP, PROJECT, ZONE, SPOT_VM),
        source="gcp.compute.preempted",
        kind=NoticeKind.PREEMPTION,
        target=Target(provider_id=f"gce://{PROJECT}/{ZONE}/{SPOT_VM}", node_name=SPOT_VM),
        issued_at=timestamp,
        deadline=timestamp + timedelta(seconds=30),
        received_at=RECEIVED,
        response=Response.FULL,
        attributes=frozen_map(
            {
                "project": PROJECT,
                "zone": ZONE,
                "region": "us-central1",
                "method": "compute.instances.preempted",
                "gce_instance_id": "1844488190123456789",
                "status_message": "Instance was preempted.",
            }
        ),
        payload_digest=digest(payload),
    )


@pytest.mark.parametrize(
    "name", ["preempted-pubsub-pull-response.json", "preempted-pubsub-push-envelope.json"]
)
def test_pubsub_forms_are_the_same_notice_as_the_entry(name: str) -> None:
    bare = one(raw("preempted-logentry.json"))
    wrapped = one(raw(name))
    assert wrapped.id == bare.id
    assert wrapped.target == bare.target
    assert (wrapped.issued_at, wrapped.deadline) == (bare.issued_at, bare.deadline)
    assert wrapped.attributes == bare.attributes
    assert wrapped.payload_digest == digest(raw(name)) != bare.payload_digest


def test_python_client_message_data_is_a_bare_entry() -> None:
    # The subscriber callback hands message.data (bytes of the LogEntry) to the parser.
    data = json.dumps(doc("preempted-python-client-message.json")["data_decoded"]).encode()
    assert one(data).id == one(raw("preempted-logentry.json")).id


def test_terminate_on_host_maintenance() -> None:
    payload = raw("terminate-on-host-maintenance-logentry.json")
    vm = "gke-train-cluster-a3-pool-7c1d2e3f-k2lm"
    op = "systemevent-1758039045487-5a4fcfbb93bc2-b8c0e7d9-37cacfb7"
    timestamp = datetime(2025, 9, 16, 16, 10, 46, 781000, tzinfo=UTC)
    assert one(payload) == Notice(
        id=stable_id("gcp.compute.maintenance", op, PROJECT, ZONE, vm),
        source="gcp.compute.maintenance",
        kind=NoticeKind.MAINTENANCE,
        target=Target(provider_id=f"gce://{PROJECT}/{ZONE}/{vm}", node_name=vm),
        issued_at=timestamp,
        deadline=timestamp + timedelta(seconds=60),
        received_at=RECEIVED,
        response=Response.FULL,
        attributes=frozen_map(
            {
                "project": PROJECT,
                "zone": ZONE,
                "region": "us-central1",
                "method": "compute.instances.terminateOnHostMaintenance",
                "maintenance": "terminate",
                "gce_instance_id": "2162224123123123213",
            }
        ),
        payload_digest=digest(payload),
    )


def test_migrate_on_host_maintenance_is_checkpoint_only() -> None:
    notice = one(raw("migrate-on-host-maintenance-logentry.json"), Windows(gce_maintenance_s=10))
    assert notice.kind is NoticeKind.MAINTENANCE
    assert notice.response is Response.CHECKPOINT_ONLY
    assert notice.target.node_name == "gke-train-cluster-default-pool-1a2b3c4d-x9yz"
    assert notice.deadline == datetime(2025, 9, 16, 9, 17, 40, 375000, tzinfo=UTC)
    assert notice.attributes["maintenance"] == "migrate"


def test_preemption_deadline_follows_the_window() -> None:
    notice = one(raw("preempted-logentry.json"), Windows(gce_preemption_s=15))
    assert notice.deadline == datetime(2025, 9, 16, 10, 42, 46, 325309, tzinfo=UTC)


# --- identity ----------------------------------------------------------------------------


def test_republished_entry_with_a_new_message_id_is_the_same_notice() -> None:
    entry = doc("preempted-logentry.json")
    assert one(pubsub(entry, "111")).id == one(pubsub(entry, "222")).id


def test_another_operation_is_another_notice() -> None:
    entry = doc("preempted-logentry.json")
    other = copy.deepcopy(entry)
    other["operation"]["id"] = "systemevent-1758019999999-63ee7a3e1f2b0-5c0d6a1e-9b7f3c21"
    assert one(entry).id != one(other).id


def test_first_and_last_entries_of_one_operation_are_one_notice() -> None:
    first = doc("preempted-logentry.json")
    last = copy.deepcopy(first)
    last["insertId"] = "zzzzz3e38dfz"
    last["operation"].update(first=False, last=True)
    first["operation"]["last"] = False
    assert one(first).id == one(last).id


def test_insert_id_when_there_is_no_operation() -> None:
    entry = doc("preempted-logentry.json")
    del entry["operation"]
    notice = one(entry)
    assert notice.id == stable_id("gcp.compute.preempted", "qnwer3e38dfz", PROJECT, ZONE, SPOT_VM)


# --- pull responses ----------------------------------------------------------------------


def _other_vm(name: str) -> dict[str, Any]:
    entry = doc("preempted-logentry.json")
    entry["protoPayload"]["resourceName"] = f"projects/{PROJECT}/zones/{ZONE}/instances/{name}"
    entry["operation"]["id"] = f"systemevent-{name}"
    return entry


def test_pull_response_with_several_preemptions() -> None:
    host_error = doc("preempted-logentry.json")
    host_error["protoPayload"]["methodName"] = "compute.instances.hostError"
    entries = [_other_vm("vm-a"), host_error, _other_vm("vm-b"), _other_vm("vm-a")]
    pull = {"receivedMessages": [{"ackId": str(i), **pubsub(e)} for i, e in enumerate(entries)]}
    out = notices(pull)
    assert [n.target.node_name for n in out] == ["vm-a", "vm-b"]


def test_pull_response_of_non_notices_is_ignored() -> None:
    entry = doc("preempted-logentry.json")
    entry["protoPayload"]["methodName"] = "compute.instances.guestTerminate"
    out = parse({"receivedMessages": [pubsub(entry), pubsub(entry)]})
    assert out == Ignored("system event 'compute.instances.guestTerminate' is not a notice")


def test_empty_pull_response_is_ignored() -> None:
    assert parse({"receivedMessages": []}) == Ignored("empty pull response")


@pytest.mark.parametrize(
    "method",
    [
        "compute.instances.hostError",
        "compute.instances.automaticRestart",
        "compute.instances.upcomingMaintenance",
        "v1.compute.instances.insert",
    ],
)
def test_other_system_events_are_ignored(method: str) -> None:
    entry = doc("preempted-logentry.json")
    entry["protoPayload"]["methodName"] = method
    out = parse(entry)
    assert isinstance(out, Ignored)
    assert method in out.reason


# --- malformed ---------------------------------------------------------------------------


def _entry_without(*path: str) -> dict[str, Any]:
    entry = doc("preempted-logentry.json")
    node = entry
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return entry


def _entry_with(value: Any, *path: str) -> dict[str, Any]:
    entry = doc("preempted-logentry.json")
    node = entry
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return entry


MALFORMED: list[tuple[Any, str]] = [
    (_entry_without("protoPayload", "methodName"), "protoPayload.methodName: missing"),
    (_entry_without("protoPayload", "resourceName"), "protoPayload.resourceName: missing"),
    (_entry_with("instances/x", "protoPayload", "resourceName"), "not a GCE instance"),
    (
        _entry_with(f"projects/{PROJECT}/zones/{ZONE}/disks/d", "protoPayload", "resourceName"),
        "not a GCE instance",
    ),
    (_entry_without("timestamp"), "timestamp: missing"),
    (_entry_with("2025-09-16 10:42", "timestamp"), "timestamp: time without a zone"),
    (_entry_with([], "protoPayload"), "protoPayload: expected an object"),
    (_entry_with("op", "operation"), "operation: expected an object"),
    (_entry_with(7, "resource", "labels", "instance_id"), "resource.labels.instance_id"),
    ({"message": {"messageId": "1"}}, "message.data: missing"),
    ({"message": {"data": "not base64!"}}, "message.data: not base64"),
    ({"message": {"data": base64.b64encode(b"[1]").decode()}}, "message.data: expected an object"),
    ({"message": {"data": base64.b64encode(b"{oops").decode()}}, "not JSON"),
    ({"receivedMessages": {}}, "receivedMessages: expected a list"),
    ({"receivedMessages": [{"ackId": "1"}]}, "receivedMessages[0].message: missing"),
    ({"logName": "projects/p/logs/x"}, "neither a LogEntry nor a Pub/Sub message"),
]


@pytest.mark.parametrize(("payload", "message"), MALFORMED)
def test_malformed_payloads_are_parse_errors(payload: Any, message: str) -> None:
    with pytest.raises(ParseError, match=re.escape(message)):
        parse(payload)


def test_entry_without_operation_or_insert_id_is_a_parse_error() -> None:
    entry = _entry_without("operation")
    del entry["insertId"]
    with pytest.raises(ParseError, match=re.escape("neither operation.id nor insertId")):
        parse(entry)


# === metadata server =====================================================================

OBSERVED = "2025-09-16T10:42:01Z"


def meta(path: str, value: str, **extra: Any) -> dict[str, Any]:
    base = {
        "instance": SPOT_VM,
        "project": PROJECT,
        "zone": ZONE,
        "path": path,
        "value": value,
        "etag": "9d2f61b0ac3e47e1",
        "observed_at": OBSERVED,
    }
    return {**base, **extra}


def meta_parse(payload: dict[str, Any], windows: Windows = DEFAULT) -> ParseOutcome:
    return gce_metadata.parse(encode(payload), received_at=RECEIVED, windows=windows)


def meta_one(payload: dict[str, Any], windows: Windows = DEFAULT) -> Notice:
    out = meta_parse(payload, windows)
    assert isinstance(out, tuple), out
    (notice,) = out
    return notice


def test_metadata_preempted_true() -> None:
    env = meta("instance/preempted", "TRUE")
    observed = datetime(2025, 9, 16, 10, 42, 1, tzinfo=UTC)
    assert meta_one(env) == Notice(
        id=stable_id("gcp.metadata.preempted", PROJECT, ZONE, SPOT_VM, "TRUE", "9d2f61b0ac3e47e1"),
        source="gcp.metadata.preempted",
        kind=NoticeKind.PREEMPTION,
        target=Target(provider_id=f"gce://{PROJECT}/{ZONE}/{SPOT_VM}", node_name=SPOT_VM),
        issued_at=observed,
        deadline=observed + timedelta(seconds=30),
        received_at=RECEIVED,
        response=Response.FULL,
        attributes=frozen_map(
            {"project": PROJECT, "zone": ZONE, "region": "us-central1", "metadata_value": "TRUE"}
        ),
        payload_digest=digest(encode(env)),
    )


def test_every_documented_metadata_value() -> None:
    # The fixture lists the values each key takes; every one must have a defined outcome.
    keys = doc("gce-metadata-maintenance.json")
    expected: dict[tuple[str, str], tuple[NoticeKind, Response, float] | None] = {
        ("instance/preempted", "FALSE"): None,
        ("instance/preempted", "TRUE"): (NoticeKind.PREEMPTION, Response.FULL, 30.0),
        ("instance/maintenance-event", "NONE"): None,
        ("instance/maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE"): (
            NoticeKind.MAINTENANCE,
            Response.CHECKPOINT_ONLY,
            60.0,
        ),
        ("instance/maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE"): (
            NoticeKind.MAINTENANCE,
            Response.FULL,
            60.0,
        ),
    }
    seen = {(path, v) for path in expected_paths(expected) for v in keys[path]["values"]}
    assert seen == set(expected)
    for (path, value), want in expected.items():
        out = meta_parse(meta(path, value))
        if want is None:
            assert isinstance(out, Ignored), (path, value)
            continue
        assert isinstance(out, tuple), (path, value)
        kind, response, window = want
        assert (out[0].kind, out[0].response) == (kind, response)
        assert out[0].deadline == out[0].issued_at + timedelta(seconds=window)


def expected_paths(expected: dict[tuple[str, str], Any]) -> set[str]:
    return {path for path, _ in expected}


def test_metadata_terminate_maintenance_window() -> None:
    notice = meta_one(
        meta("instance/maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE"),
        Windows(gce_maintenance_s=45),
    )
    assert notice.source == "gcp.metadata.maintenance"
    assert notice.deadline == datetime(2025, 9, 16, 10, 42, 46, tzinfo=UTC)
    assert notice.attributes["maintenance"] == "terminate"


def test_metadata_repeat_reads_are_one_notice_and_a_new_etag_is_another() -> None:
    first = meta_one(meta("instance/maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE"))
    again = meta_one(
        meta(
            "instance/maintenance-event",
            "TERMINATE_ON_HOST_MAINTENANCE",
            observed_at="2025-09-16T10:42:09Z",
        )
    )
    later = meta_one(
        meta("instance/maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE", etag="77aa")
    )
    assert first.id == again.id
    assert later.id != first.id


def test_metadata_without_observed_at_is_issued_when_received() -> None:
    env = meta("instance/preempted", "TRUE")
    del env["observed_at"]
    notice = meta_one(env)
    assert notice.issued_at == RECEIVED
    assert notice.deadline == RECEIVED + timedelta(seconds=30)


@pytest.mark.parametrize(
    "path",
    [
        "/computeMetadata/v1/instance/preempted",
        "computeMetadata/v1/instance/preempted?wait_for_change=true&last_etag=abc",
        "instance/preempted",
    ],
)
def test_metadata_path_forms(path: str) -> None:
    assert meta_one(meta(path, "TRUE\n")).source == "gcp.metadata.preempted"


METADATA_MALFORMED: list[tuple[dict[str, Any], str]] = [
    (meta("instance/preempted", "true-ish"), "is not a value of instance/preempted"),
    (meta("instance/maintenance-event", "TRUE"), "is not a value of instance/maintenance-event"),
    (meta("instance/scheduling/preemptible", "TRUE"), "path: not a metadata notice key"),
    (meta("instance/preempted", "TRUE", zone="us/central"), "zone: not a GCE zone"),
    (meta("instance/preempted", "TRUE", instance=""), "instance: empty"),
    (meta("instance/preempted", "TRUE", project=None), "project: missing"),
    (meta("instance/preempted", "TRUE", observed_at="now"), "observed_at: not an RFC 3339"),
    (meta("instance/preempted", "TRUE", etag=1), "etag: expected a string"),
    (meta("instance/preempted", True), "value: expected a string"),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("payload", "message"), METADATA_MALFORMED)
def test_malformed_metadata_envelopes_are_parse_errors(
    payload: dict[str, Any], message: str
) -> None:
    with pytest.raises(ParseError, match=re.escape(message)):
        meta_parse(payload)


def test_metadata_envelope_without_a_vm_is_malformed_even_when_no_notice() -> None:
    env = meta("instance/preempted", "FALSE")
    del env["instance"]
    with pytest.raises(ParseError, match=re.escape("instance: missing")):
        meta_parse(env)
