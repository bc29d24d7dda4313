"""The cache's indexes fed raw API objects, as the watch delivers them (no server)."""

from __future__ import annotations

import dataclasses
from typing import Any, cast

import pytest

from reclaimd.cluster import claims
from reclaimd.cluster.cache import CLAIM_ANNOTATION, ClusterCache, NodeView
from reclaimd.cluster.watch import Changed, Listed
from reclaimd.model import Target

CLAIM = '{"holder":"reclaimd-0","notice":"n-1"}'


def node(
    name: str,
    rv: str,
    *,
    unschedulable: bool | None = None,
    taints: list[dict[str, Any]] | None = None,
    claim: str | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "resourceVersion": rv,
        "labels": {"sku": "h100"},
        "annotations": {"unrelated": "x" * 100},
        "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}],
    }
    if claim is not None:
        meta["annotations"][CLAIM_ANNOTATION] = claim
    spec: dict[str, Any] = {"providerID": f"aws:///us-east-2a/i-{name}"}
    if unschedulable is not None:
        spec["unschedulable"] = unschedulable
    if taints is not None:
        spec["taints"] = taints
    return {"metadata": meta, "spec": spec, "status": {"capacity": {"cpu": "96"}}}


def new_cache() -> ClusterCache:
    # The appliers and queries never touch the API client; only start() does.
    return ClusterCache(cast(Any, None))


SPOT_TAINT = {
    "key": "reclaimd.io/reclaiming",
    "value": "spot",
    "effect": "NoSchedule",
    "timeAdded": "2025-01-02T03:04:05Z",
}


def test_claim_annotation_name_matches_the_claim_log() -> None:
    assert CLAIM_ANNOTATION == claims.CLAIM_ANNOTATION


def test_node_view_of_a_plain_node() -> None:
    cache = new_cache()
    cache._on_node(Listed((node("a", "41"),), "50"))
    assert cache.node("a") == NodeView(
        name="a",
        resource_version="41",
        unschedulable=False,
        taints=(),
        claim_text=None,
        labels={"sku": "h100"},
    )
    assert cache.node("missing") is None


def test_node_view_carries_taints_cordon_and_the_raw_claim() -> None:
    cache = new_cache()
    odd = {"key": "gpu", "effect": "NoExecute", "value": None, "extra": "dropped"}
    cache._on_node(
        Listed((node("a", "41", unschedulable=True, taints=[SPOT_TAINT, odd], claim=CLAIM),), "50")
    )
    view = cache.node("a")
    assert view is not None
    assert view.resource_version == "41"
    assert view.unschedulable is True
    assert view.taints == (SPOT_TAINT, {"key": "gpu", "effect": "NoExecute"})
    assert view.claim_text == CLAIM


def test_watch_events_update_and_delete_the_view() -> None:
    cache = new_cache()
    cache._on_node(Listed((node("a", "41"),), "50"))
    cache._on_node(Changed("MODIFIED", node("a", "52", unschedulable=True, claim=CLAIM)))
    view = cache.node("a")
    assert view is not None
    assert (view.resource_version, view.unschedulable, view.claim_text) == ("52", True, CLAIM)
    cache._on_node(Changed("MODIFIED", node("a", "53", unschedulable=False)))
    view = cache.node("a")
    assert view is not None
    assert (view.resource_version, view.unschedulable, view.claim_text) == ("53", False, None)
    cache._on_node(Changed("DELETED", node("a", "54")))
    assert cache.node("a") is None
    assert cache.resolve_node(Target(instance_id="i-a")) is None


def test_a_relist_replaces_the_views() -> None:
    cache = new_cache()
    cache._on_node(Listed((node("a", "41"), node("b", "42")), "50"))
    cache._on_node(Listed((node("b", "60", claim=CLAIM),), "61"))
    assert cache.node("a") is None
    view = cache.node("b")
    assert view is not None
    assert (view.resource_version, view.claim_text) == ("60", CLAIM)


def test_node_view_is_frozen_and_editing_its_taints_leaves_the_cache_alone() -> None:
    cache = new_cache()
    cache._on_node(Listed((node("a", "41", taints=[SPOT_TAINT]),), "50"))
    view = cache.node("a")
    assert view is not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.unschedulable = True  # type: ignore[misc]
    view.taints[0]["value"] = "edited"
    again = cache.node("a")
    assert again is not None
    assert again.taints == (SPOT_TAINT,)
