"""A pod already gone when the drain looks is charged to when it went, not to when we looked;
and what the actions read and write over the API."""

from datetime import UTC, datetime, timedelta
from typing import Any, cast

from fake_apiserver import FakeApiServer

from reclaimd.cluster.actions import ClusterActions, _eviction
from reclaimd.cluster.ratelimit import RateLimiter
from reclaimd.cluster.taints import TAINT_KEY
from reclaimd.model import Member, Notice, NoticeKind, Target

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
POD = Member(namespace="ns", name="r0", uid="u0", node="n1", gpus=8)


async def test_a_pod_the_cache_saw_leave_stops_when_it_left() -> None:
    left = NOW - timedelta(seconds=17)  # a dead owner evicted it; we took over 17 s later
    actions = ClusterActions(
        cast(Any, None),  # pod_exists answers: no call reaches the API
        limiter=RateLimiter(),
        pod_exists=lambda ns, name, uid: False,
        clock=lambda: NOW,
        gone_at=lambda uid: left if uid == "u0" else None,
    )
    assert await actions.wait_gone(POD, deadline=NOW + timedelta(seconds=60)) == left
    other = Member(namespace="ns", name="r1", uid="u1", node="n1", gpus=8)
    assert await actions.wait_gone(other, deadline=NOW + timedelta(seconds=60)) == NOW


async def test_a_pod_gone_unseen_is_charged_no_later_than_the_deadline() -> None:
    """A fresh process taking a notice over after its deadline: the pod went by then."""
    actions = ClusterActions(
        cast(Any, None),  # pod_exists answers: no call reaches the API
        limiter=RateLimiter(),
        pod_exists=lambda ns, name, uid: False,
        clock=lambda: NOW,
        gone_at=lambda uid: None,
    )
    deadline = NOW - timedelta(seconds=40)
    assert await actions.wait_gone(POD, deadline=deadline) == deadline


# --- over the API, without the cache ---------------------------------------------------------


async def test_a_pod_is_there_while_its_name_holds_the_same_uid() -> None:
    api = FakeApiServer(
        {"/api/v1/namespaces/ns/pods/r0": {"metadata": {"name": "r0", "uid": "u0"}}}
    )
    actions = ClusterActions(api, limiter=RateLimiter(), clock=lambda: NOW)
    assert await actions._still_there(POD)
    api.objects["/api/v1/namespaces/ns/pods/r0"]["metadata"]["uid"] = "u-successor"
    assert not await actions._still_there(POD)
    del api.objects["/api/v1/namespaces/ns/pods/r0"]
    assert not await actions._still_there(POD)
    assert [r[:2] for r in api.requests] == [("GET", "/api/v1/namespaces/ns/pods/r0")] * 3


async def test_cordon_keeps_other_taints_as_the_api_spells_them_at_the_version_read() -> None:
    theirs = {
        "key": "gpu",
        "value": "h100",
        "effect": "NoSchedule",
        "timeAdded": "2026-03-01T11:00:00Z",
    }
    node = {"metadata": {"name": "n1", "resourceVersion": "77"}, "spec": {"taints": [theirs]}}
    api = FakeApiServer({"/api/v1/nodes/n1": node})
    actions = ClusterActions(api, limiter=RateLimiter(), clock=lambda: NOW)
    notice = Notice(
        id="n-1",
        source="t",
        kind=NoticeKind.SPOT_INTERRUPTION,
        target=Target(node_name="n1"),
        issued_at=NOW,
        deadline=NOW + timedelta(seconds=120),
        received_at=NOW,
    )
    await actions.cordon_and_taint("n1", notice)
    ours = {"key": TAINT_KEY, "value": "spot_interruption", "effect": "NoSchedule"}
    assert api.requests[1:] == [
        (
            "PATCH",
            "/api/v1/nodes/n1",
            {
                "metadata": {"resourceVersion": "77"},
                "spec": {"unschedulable": True, "taints": [theirs, ours]},
            },
        )
    ]
    # Already cordoned with our taint: read, and nothing written.
    node["spec"] = {"unschedulable": True, "taints": [theirs, ours]}
    api.sent.clear()
    await actions.cordon_and_taint("n1", notice)
    assert [r[0] for r in api.requests] == ["GET"]
    # A node gone is nothing to cordon.
    await actions.cordon_and_taint("n2", notice)


def test_an_eviction_without_a_uid_has_no_precondition() -> None:
    anyone = Member(namespace="ns", name="r0", uid="", node="n1", gpus=8)
    assert _eviction(anyone) == {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": "r0", "namespace": "ns"},
        "deleteOptions": {},
    }
