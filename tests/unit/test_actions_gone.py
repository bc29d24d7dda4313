"""A pod already gone when the drain looks is charged to when it went, not to when we looked."""

from datetime import UTC, datetime, timedelta
from typing import Any, cast

from kubernetes_asyncio import client as k8s

from reclaimd.cluster.actions import ClusterActions
from reclaimd.cluster.ratelimit import RateLimiter
from reclaimd.model import Member

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
POD = Member(namespace="ns", name="r0", uid="u0", node="n1", gpus=8)


async def test_a_pod_the_cache_saw_leave_stops_when_it_left() -> None:
    left = NOW - timedelta(seconds=17)  # a dead owner evicted it; we took over 17 s later
    actions = ClusterActions(
        cast(Any, k8s.ApiClient()),
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
        cast(Any, k8s.ApiClient()),
        limiter=RateLimiter(),
        pod_exists=lambda ns, name, uid: False,
        clock=lambda: NOW,
        gone_at=lambda uid: None,
    )
    deadline = NOW - timedelta(seconds=40)
    assert await actions.wait_gone(POD, deadline=deadline) == deadline
