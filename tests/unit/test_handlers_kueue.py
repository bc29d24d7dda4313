"""Kueue reclaim notices from Workload objects (handlers/kueue/parser.py)."""

from __future__ import annotations

import copy
import json
import re
from datetime import UTC, datetime
from typing import Any

import pytest
from shared_fixtures import FIXTURES as SHARED

from reclaimd.handlers.kueue import parser as kueue_reclaim
from reclaimd.model import (
    Ignored,
    Notice,
    NoticeKind,
    ParseError,
    ParseOutcome,
    Response,
    Target,
    Windows,
    WorkloadRef,
    digest,
    frozen_map,
    stable_id,
)

FIXTURES = SHARED / "kueue"
RECEIVED = datetime(2025, 9, 16, 11, 30, 13, tzinfo=UTC)
DEFAULT = Windows()
UID = "a7d3c1e2-9f8b-4a6c-b5d4-e3f2a1b0c9d8"
T0_V1BETA2 = "workload-v1beta2-reclaim-preempted-t0-evicted.json"
T0_V1BETA1 = "workload-v1beta1-reclaim-preempted-t0-evicted.json"
T1_V1BETA2 = "workload-v1beta2-reclaim-preempted-t1-requeued.json"
MESSAGE = (
    "Preempted to accommodate a workload (UID: 0b8e4f7a-2c1d-4e5f-9a8b-7c6d5e4f3a2b, "
    "JobUID: 5c023c28-8533-4927-b266-56bca5e310c1) due to reclamation within the cohort; "
    "preemptor path: /research/cq-team-a; preemptee path: /research/cq-team-b"
)
TRANSITION = datetime(2025, 9, 16, 11, 30, 12, tzinfo=UTC)


def raw(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def doc(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(raw(name))
    return data


def parse(payload: bytes | dict[str, Any], windows: Windows = DEFAULT) -> ParseOutcome:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return kueue_reclaim.parse(body, received_at=RECEIVED, windows=windows)


def one(payload: bytes | dict[str, Any], windows: Windows = DEFAULT) -> Notice:
    out = parse(payload, windows)
    assert isinstance(out, tuple), out
    (notice,) = out
    return notice


def condition(workload: dict[str, Any], kind: str) -> dict[str, Any]:
    found: dict[str, Any] = next(c for c in workload["status"]["conditions"] if c["type"] == kind)
    return found


def without(workload: dict[str, Any], kind: str) -> dict[str, Any]:
    workload["status"]["conditions"] = [
        c for c in workload["status"]["conditions"] if c["type"] != kind
    ]
    return workload


# --- every fixture, field by field -------------------------------------------------------


def test_v1beta2_reclaim_victim_right_after_eviction() -> None:
    payload = raw(T0_V1BETA2)
    assert one(payload) == Notice(
        id=stable_id("kueue.workload", UID, "2025-09-16T11:30:12Z"),
        source="kueue.workload",
        kind=NoticeKind.RECLAIM,
        target=Target(workload=WorkloadRef("team-b", "job-train-b-f1c5a", UID)),
        issued_at=TRANSITION,
        deadline=datetime(2025, 9, 16, 11, 30, 42, tzinfo=UTC),
        received_at=RECEIVED,
        response=Response.NO_CORDON,
        attributes=frozen_map(
            {
                "reason": "InCohortReclamation",
                "eviction_reason": "Preempted",
                "message": MESSAGE,
                "preemptor_workload_uid": "0b8e4f7a-2c1d-4e5f-9a8b-7c6d5e4f3a2b",
                "preemptor_job_uid": "5c023c28-8533-4927-b266-56bca5e310c1",
                "cluster_queue": "cq-team-b",
                "local_queue": "lq-team-b",
                "api_version": "kueue.x-k8s.io/v1beta2",
            }
        ),
        payload_digest=digest(payload),
    )


def test_v1beta1_is_the_same_notice() -> None:
    v1beta1, v1beta2 = one(raw(T0_V1BETA1)), one(raw(T0_V1BETA2))
    assert v1beta1.id == v1beta2.id
    assert (v1beta1.target, v1beta1.deadline) == (v1beta2.target, v1beta2.deadline)
    assert v1beta1.attributes["api_version"] == "kueue.x-k8s.io/v1beta1"
    assert {k: v for k, v in v1beta1.attributes.items() if k != "api_version"} == {
        k: v for k, v in v1beta2.attributes.items() if k != "api_version"
    }


def test_requeued_update_of_the_same_eviction_is_the_same_notice() -> None:
    t0, t1 = one(raw(T0_V1BETA2)), one(raw(T1_V1BETA2))
    assert t1.id == t0.id
    assert t1.deadline == t0.deadline
    # The admission is gone once quota is released: no cluster queue to report.
    assert "cluster_queue" not in t1.attributes
    assert t1.attributes["reason"] == "InCohortReclamation"


def test_parsing_twice_gives_the_same_id() -> None:
    assert one(raw(T0_V1BETA2)).id == one(raw(T0_V1BETA2)).id


def test_kueue_events_are_not_workloads() -> None:
    for event in doc("events-preemption.json")["items"]:
        with pytest.raises(ParseError, match="not a Kueue Workload"):
            parse(event)


# --- which condition decides -------------------------------------------------------------


def test_preempted_condition_alone_is_a_notice() -> None:
    workload = without(doc(T0_V1BETA2), "Evicted")
    notice = one(workload)
    assert notice.attributes["reason"] == "InCohortReclamation"
    assert "eviction_reason" not in notice.attributes
    assert notice.id == one(raw(T0_V1BETA2)).id


def test_evicted_preempted_alone_is_a_notice() -> None:
    workload = without(doc(T0_V1BETA2), "Preempted")
    notice = one(workload)
    assert notice.attributes["reason"] == "Preempted"
    assert notice.attributes["message"] == MESSAGE
    assert notice.id == one(raw(T0_V1BETA2)).id


def test_evicted_time_decides_when_both_say_preempted() -> None:
    workload = doc(T0_V1BETA2)
    condition(workload, "Preempted")["lastTransitionTime"] = "2025-09-16T11:30:14Z"
    assert one(workload).issued_at == TRANSITION


@pytest.mark.parametrize(
    "reason",
    [
        "InClusterQueue",
        "InCohortFairSharing",
        "InCohortReclaimWhileBorrowing",
        "InCohortReclamation",
    ],
)
def test_preemption_reason_is_kept(reason: str) -> None:
    workload = doc(T0_V1BETA2)
    condition(workload, "Preempted")["reason"] = reason
    assert one(workload).attributes["reason"] == reason


def test_a_new_preemption_of_the_same_workload_is_a_new_notice() -> None:
    first = doc(T0_V1BETA2)
    again = copy.deepcopy(first)
    for kind in ("Evicted", "Preempted"):
        condition(again, kind)["lastTransitionTime"] = "2025-09-16T14:05:00Z"
    assert one(first).id != one(again).id
    assert one(again).deadline == datetime(2025, 9, 16, 14, 5, 30, tzinfo=UTC)


def test_deadline_follows_the_grace_window() -> None:
    notice = one(raw(T0_V1BETA2), Windows(kueue_grace_s=12.5))
    assert notice.deadline == datetime(2025, 9, 16, 11, 30, 24, 500000, tzinfo=UTC)


def test_long_messages_are_bounded() -> None:
    workload = doc(T0_V1BETA2)
    condition(workload, "Preempted")["message"] = "x" * 5000
    assert len(one(workload).attributes["message"]) == 1024


# --- not a reclaim -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "cls"),
    [
        ("PodsReadyTimeout", "pods-ready timeout"),
        ("AdmissionCheck", "admission check"),
        ("ClusterQueueStopped", "queue stopped"),
        ("LocalQueueStopped", "queue stopped"),
        ("Deactivated", "deactivated"),
        ("DeactivatedDueToMaximumExecutionTimeExceeded", "deactivated"),
        ("DeactivatedDueToRequeuingLimitExceeded", "deactivated"),
        ("NodeFailures", "node failure"),
        ("EvictedOnManagerCluster", "multikueue"),
        ("WorkloadSliceReplaced", "slice replaced"),
        ("FlavorMigration", "flavor migration"),
        ("SomethingNew", "unclassified"),
    ],
)
def test_other_evictions_are_ignored_with_their_class(reason: str, cls: str) -> None:
    workload = without(doc(T0_V1BETA2), "Preempted")
    condition(workload, "Evicted")["reason"] = reason
    assert parse(workload) == Ignored(f"evicted for '{reason}' ({cls}), not a preemption")


def test_readmitted_workload_is_ignored() -> None:
    workload = doc(T1_V1BETA2)
    for kind in ("Evicted", "Preempted"):
        c = condition(workload, kind)
        c.update(status="False", reason="QuotaReserved", message="Previously: " + MESSAGE)
    assert parse(workload) == Ignored("workload is not evicted")


@pytest.mark.parametrize("status", [None, {}, {"conditions": []}, {"conditions": None}])
def test_workload_without_conditions_is_ignored(status: Any) -> None:
    workload = doc(T0_V1BETA2)
    if status is None:
        del workload["status"]
    else:
        workload["status"] = status
    assert parse(workload) == Ignored("workload is not evicted")


# --- watch events and list items ---------------------------------------------------------


def test_watch_event_is_unwrapped() -> None:
    event = {"type": "MODIFIED", "object": doc(T0_V1BETA2)}
    assert one(event).id == one(raw(T0_V1BETA2)).id


def test_deleted_watch_event_is_ignored() -> None:
    out = parse({"type": "DELETED", "object": doc(T0_V1BETA2)})
    assert out == Ignored("watch event DELETED is no eviction")


def test_bookmark_is_ignored() -> None:
    bookmark = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"resourceVersion": "191300"},
    }
    out = parse({"type": "BOOKMARK", "object": bookmark})
    assert out == Ignored("watch event BOOKMARK is no eviction")


def test_list_item_without_api_version_and_kind() -> None:
    workload = doc(T0_V1BETA2)
    del workload["apiVersion"], workload["kind"]
    notice = one(workload)
    assert notice.id == one(raw(T0_V1BETA2)).id
    assert "api_version" not in notice.attributes


# --- malformed ---------------------------------------------------------------------------


def _mutated(change: Any) -> dict[str, Any]:
    workload = doc(T0_V1BETA2)
    change(workload)
    return workload


MALFORMED: list[tuple[dict[str, Any], str]] = [
    (_mutated(lambda w: w.update(kind="Pod")), "not a Kueue Workload"),
    (_mutated(lambda w: w.update(apiVersion="batch/v1")), "not a Kueue Workload"),
    (_mutated(lambda w: w.pop("metadata")), "metadata: missing"),
    (_mutated(lambda w: w["metadata"].pop("uid")), "metadata.uid: missing"),
    (
        _mutated(lambda w: w["metadata"].update(namespace=3)),
        "metadata.namespace: expected a string",
    ),
    (_mutated(lambda w: w.update(status=[])), "status: expected an object"),
    (_mutated(lambda w: w["status"].update(conditions={})), "status.conditions: expected a list"),
    (
        _mutated(lambda w: w["status"].update(conditions=["Evicted"])),
        "status.conditions[0]: expected an object",
    ),
    (
        _mutated(lambda w: w["status"]["conditions"][3].pop("status")),
        "status.conditions[Evicted].status: missing",
    ),
    (
        _mutated(lambda w: w["status"]["conditions"][3].pop("reason")),
        "status.conditions[Evicted].reason: missing",
    ),
    (
        _mutated(lambda w: w["status"]["conditions"][3].update(lastTransitionTime="11:30")),
        "status.conditions[Evicted].lastTransitionTime: not an RFC 3339 time",
    ),
    (
        _mutated(lambda w: w["status"]["conditions"][3].pop("lastTransitionTime")),
        "status.conditions[Evicted].lastTransitionTime: missing",
    ),
    (
        _mutated(lambda w: w["status"]["conditions"][4].pop("reason")),
        "status.conditions[Preempted].reason: missing",
    ),
    (
        _mutated(lambda w: w["status"]["conditions"][0].pop("type")),
        "status.conditions[0].type: missing",
    ),
]


@pytest.mark.parametrize(("payload", "message"), MALFORMED)
def test_malformed_workloads_are_parse_errors(payload: dict[str, Any], message: str) -> None:
    with pytest.raises(ParseError, match=re.escape(message)):
        parse(payload)


@pytest.mark.parametrize(
    "payload", [b"", b"{", b"[]", b'{"type": "MODIFIED", "object": []}', b"\xc3\x28"]
)
def test_payloads_that_are_no_workload_are_parse_errors(payload: bytes) -> None:
    with pytest.raises(ParseError):
        parse(payload)
