"""The claim decision (reclaimd.cluster.claims.decide), the claim's JSON form, and the
requests the store makes for it."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fake_apiserver import FakeApiServer

from reclaimd.cluster.claims import (
    CLAIM_ANNOTATION,
    HANDLED_KEPT,
    Claim,
    ClaimStatus,
    NodeObj,
    Phase,
    WorkloadObj,
    decide,
    handled_after,
)
from reclaimd.cluster.claimstore import ClaimStore
from reclaimd.model import Notice, NoticeKind, ParseError, Target, frozen_map

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
LEASE_S = 20.0
NODE = NodeObj("gpu-1")


def notice(nid: str, deadline_s: float | None) -> Notice:
    return Notice(
        id=nid,
        source="t",
        kind=NoticeKind.SPOT_INTERRUPTION,
        target=Target(node_name="gpu-1"),
        issued_at=NOW,
        deadline=NOW + timedelta(seconds=deadline_s) if deadline_s is not None else None,
        received_at=NOW,
    )


def claim(
    nid: str,
    *,
    holder: str = "b",
    deadline_s: float | None = 120,
    phase: Phase = Phase.CLAIMED,
    heartbeat_age_s: float = 0,
) -> Claim:
    return Claim(
        target=NODE,
        notice_id=nid,
        deadline=NOW + timedelta(seconds=deadline_s) if deadline_s is not None else None,
        holder=holder,
        phase=phase,
        claimed_at=NOW - timedelta(minutes=1),
        heartbeat_at=NOW - timedelta(seconds=heartbeat_age_s),
    )


@pytest.mark.parametrize(
    ("existing", "incoming", "status"),
    [
        (None, notice("n1", 120), ClaimStatus.CLAIMED),
        (claim("n1", holder="a"), notice("n1", 120), ClaimStatus.ALREADY_OURS),
        (claim("n1"), notice("n1", 120), ClaimStatus.DUPLICATE),
        (claim("n1", heartbeat_age_s=LEASE_S + 1), notice("n1", 120), ClaimStatus.TAKEN_OVER),
        (claim("n1", holder="a", phase=Phase.DONE), notice("n1", 120), ClaimStatus.DUPLICATE),
        (claim("n1", deadline_s=60), notice("n2", 120), ClaimStatus.SUPERSEDED),
        (claim("n1", deadline_s=120), notice("n2", 120), ClaimStatus.SUPERSEDED),
        (claim("n1", deadline_s=120), notice("n2", 30), ClaimStatus.CLAIMED),
        (claim("n1", deadline_s=None), notice("n2", 120), ClaimStatus.CLAIMED),
        (claim("n1", deadline_s=None), notice("n2", None), ClaimStatus.SUPERSEDED),
        (claim("n1", deadline_s=60), notice("n2", None), ClaimStatus.SUPERSEDED),
        (claim("n1", phase=Phase.DONE), notice("n2", 120), ClaimStatus.CLAIMED),
        # Past its deadline with a dead holder: abandoned, the new notice takes the node.
        (
            claim("n1", deadline_s=-5, heartbeat_age_s=LEASE_S + 1),
            notice("n2", 120),
            ClaimStatus.CLAIMED,
        ),
        # Past its deadline but its holder is still finishing (ledger): leave it be.
        (claim("n1", deadline_s=-5), notice("n2", 120), ClaimStatus.SUPERSEDED),
    ],
)
def test_decide(existing: Claim | None, incoming: Notice, status: ClaimStatus) -> None:
    assert decide(existing, incoming, "a", NOW, LEASE_S) is status


def test_a_late_copy_of_a_notice_an_earlier_claim_handled_is_a_duplicate() -> None:
    """n1 finished on the node, then n2's claim replaced it: a copy of n1 arriving after
    n2 finished too (a redelivery, a slot's seek back) does not claim the node again."""
    first = claim("n1", phase=Phase.DONE, deadline_s=30)
    second = replace(claim("n2", phase=Phase.DONE), handled=frozen_map(handled_after(first, NOW)))
    assert decide(second, notice("n1", 30), "a", NOW, LEASE_S) is ClaimStatus.DUPLICATE
    assert decide(second, notice("n3", 120), "a", NOW, LEASE_S) is ClaimStatus.CLAIMED
    # a third claim keeps both earlier notices; one long past its deadline is let go (the
    # intake expires its copies), and the list is bounded
    third = handled_after(second, NOW)
    assert list(third) == ["n1", "n2"]
    assert list(handled_after(second, NOW + timedelta(minutes=16))) == ["n2"]
    many = claim("n0", phase=Phase.DONE)
    for i in range(1, 40):
        many = replace(
            claim(f"n{i}", phase=Phase.DONE), handled=frozen_map(handled_after(many, NOW))
        )
    assert len(many.handled) == HANDLED_KEPT and "n38" in many.handled
    assert Claim.from_json(NODE, json.dumps(many.to_json())) == many


def test_claim_round_trips_through_the_annotation() -> None:
    original = claim("n1", phase=Phase.SIGNALED)
    text = json.dumps(original.to_json())
    assert Claim.from_json(NODE, text) == original


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[]",
        '{"notice_id": "x"}',
        '{"notice_id":"x","holder":"h","phase":"nope","claimed_at":"2026-05-01T12:00:00Z"}',
    ],
)
def test_unreadable_claims_are_one_line_parse_errors(text: str) -> None:
    with pytest.raises(ParseError) as e:
        Claim.from_json(NODE, text)
    assert "\n" not in str(e.value) and "node/gpu-1" in str(e.value)


@pytest.mark.parametrize(
    ("renewed_ago_s", "status"),
    [
        (None, ClaimStatus.TAKEN_OVER),  # no Lease seen, claim written long ago: dead
        (5.0, ClaimStatus.DUPLICATE),  # its holder's Lease is fresh: a live peer's claim
        (LEASE_S + 1, ClaimStatus.TAKEN_OVER),  # the Lease went stale too (crashed, hung)
    ],
)
def test_a_claim_lives_as_long_as_its_holders_lease(
    renewed_ago_s: float | None, status: ClaimStatus
) -> None:
    old = claim("n1", heartbeat_age_s=LEASE_S * 3)
    renewed = None if renewed_ago_s is None else NOW - timedelta(seconds=renewed_ago_s)
    assert decide(old, notice("n1", 120), "a", NOW, LEASE_S, renewed=renewed) is status


def test_the_cache_copy_seeds_the_first_write() -> None:
    from reclaimd.cluster.claimstore import _seeded
    from reclaimd.cluster.indexes import NodeView

    text = json.dumps(claim("n1").to_json())
    view = NodeView("gpu-1", "42", False, ({"key": "k", "effect": "NoSchedule"},), text, {})
    read = _seeded(NODE, view)
    assert read is not None and read.version == "42" and read.claim == claim("n1")
    assert read.taints == ({"key": "k", "effect": "NoSchedule"},)
    # no version known (not cached yet) or a workload target: read from the API instead
    assert _seeded(NODE, NodeView("gpu-1", "", False, (), None, {})) is None


def test_cordon_spec_keeps_other_taints_and_is_idempotent() -> None:
    from reclaimd.cluster.taints import TAINT_KEY, cordon_spec

    other = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    spec = cordon_spec(False, [other], "spot_interruption")
    assert spec == {
        "unschedulable": True,
        "taints": [other, {"key": TAINT_KEY, "value": "spot_interruption", "effect": "NoSchedule"}],
    }
    assert cordon_spec(True, spec["taints"], "spot_interruption") is None
    moved = cordon_spec(True, spec["taints"], "maintenance")
    assert moved is not None and [t["value"] for t in moved["taints"]] == ["present", "maintenance"]


def test_claims_are_served_as_if_due_when_issued_but_far_changes_wait() -> None:
    from reclaimd.cluster.claims import claim_order

    spot = notice("n1", 120)
    assert claim_order(spot) == spot.issued_at  # before every eviction of the storm
    far = notice("n2", 14 * 86400)
    assert far.deadline is not None
    assert claim_order(far) == far.deadline - timedelta(seconds=120)
    assert claim_order(notice("n3", None)) is None


def test_a_claim_of_a_holder_known_dead_is_taken_over_at_once() -> None:
    """A fresh claim (written a second ago, its holder's Lease renewed a second ago) of a
    holder that refused our probe: taken over now, not a Lease later."""
    fresh = claim("n1", heartbeat_age_s=1.0)
    renewed = NOW - timedelta(seconds=1)
    n = notice("n1", 120)
    assert decide(fresh, n, "a", NOW, LEASE_S, renewed=renewed) is ClaimStatus.DUPLICATE
    assert decide(fresh, n, "a", NOW, LEASE_S, renewed=renewed, dead=True) is (
        ClaimStatus.TAKEN_OVER
    )


# --- the store over the API server ----------------------------------------------------------------


DISCOVERY = {"/apis": {"groups": [{"name": "kueue.x-k8s.io", "versions": [
    {"groupVersion": "kueue.x-k8s.io/v1beta2", "version": "v1beta2"}]}]}}  # fmt: skip


def fake(objects: dict[str, dict[str, Any]]) -> FakeApiServer:
    """Objects by path, and discovery: Kueue serves v1beta2."""
    return FakeApiServer({**DISCOVERY, **objects})


def store(api: FakeApiServer) -> ClaimStore:
    return ClaimStore(api, "a", lease_s=20.0, clock=lambda: NOW)


THEIR_TAINT = {
    "key": "nvidia.com/gpu",
    "value": "present",
    "effect": "NoSchedule",
    "timeAdded": "2026-05-01T11:00:00Z",
}


async def test_a_node_claim_is_one_merge_patch_at_the_version_read_with_the_cordon() -> None:
    from reclaimd.cluster.taints import TAINT_KEY

    node = {
        "metadata": {"name": "gpu-1", "resourceVersion": "5", "annotations": {"x": "y"}},
        "spec": {"taints": [THEIR_TAINT]},
    }
    api = fake({"/api/v1/nodes/gpu-1": node})
    result = await store(api).claim(NODE, notice("n1", 120), cordon=True)
    assert result.status is ClaimStatus.CLAIMED and result.claim is not None
    read, written = api.requests
    assert read == ("GET", "/api/v1/nodes/gpu-1", {})
    text = json.dumps(result.claim.to_json(), sort_keys=True, separators=(",", ":"))
    ours = {"key": TAINT_KEY, "value": "spot_interruption", "effect": "NoSchedule"}
    assert written == (
        "PATCH",
        "/api/v1/nodes/gpu-1",
        {
            "metadata": {"resourceVersion": "5", "annotations": {CLAIM_ANNOTATION: text}},
            "spec": {"unschedulable": True, "taints": [THEIR_TAINT, ours]},
        },
    )
    # What is on the node now reads back as the claim, ours.
    node["metadata"]["annotations"] = {CLAIM_ANNOTATION: text}
    assert await store(api).get(NODE) == result.claim
    assert await store(api).get(NodeObj("gone")) is None


async def test_a_workload_claim_is_written_at_the_served_version() -> None:
    wl = "/apis/kueue.x-k8s.io/v1beta2/namespaces/team-b/workloads/job-wl"
    meta = {"name": "job-wl", "namespace": "team-b", "resourceVersion": "9"}
    api = fake({wl: {"metadata": meta}})
    result = await store(api).claim(WorkloadObj("team-b", "job-wl"), notice("n1", 120))
    assert result.status is ClaimStatus.CLAIMED
    assert [(m, p) for m, p, _ in api.requests] == [("GET", "/apis"), ("GET", wl), ("PATCH", wl)]
    body = api.requests[-1][2]
    assert body["metadata"]["resourceVersion"] == "9" and "spec" not in body


async def test_open_claims_are_listed_from_nodes_and_workloads() -> None:
    text = json.dumps(claim("n1", holder="b").to_json())
    done = json.dumps(claim("n0", phase=Phase.DONE).to_json())
    nodes = {
        "items": [
            {"metadata": {"name": "gpu-1", "annotations": {CLAIM_ANNOTATION: text}}},
            {"metadata": {"name": "gpu-2", "annotations": {CLAIM_ANNOTATION: done}}},
            {"metadata": {"name": "gpu-3"}},
        ]
    }
    wl = {"metadata": {"name": "w", "namespace": "ml", "annotations": {CLAIM_ANNOTATION: text}}}
    api = fake(
        {
            "/api/v1/nodes": nodes,
            "/apis/kueue.x-k8s.io/v1beta2/workloads": {"items": [wl]},
            "/apis/kueue.x-k8s.io/v1beta2/namespaces/ml/workloads": {"items": [wl]},
        }
    )
    found = await store(api).list_open()
    assert [c.target for c in found] == [NodeObj("gpu-1"), WorkloadObj("ml", "w")]
    api.sent.clear()
    found = await store(api).list_open(("ml",), node_claims=[("gpu-9", text)])
    assert [c.target for c in found] == [NodeObj("gpu-9"), WorkloadObj("ml", "w")]
    assert [p for _, p, _ in api.requests] == [
        "/apis/kueue.x-k8s.io/v1beta2/namespaces/ml/workloads"
    ]
    # No Workloads collection (404): no Kueue in this cluster, the nodes' claims only.
    found = await store(api).list_open(("ml", "other"), node_claims=[("gpu-9", text)])
    assert [c.target for c in found] == [NodeObj("gpu-9")]
