"""The cache's indexes fed raw API objects, as the watch delivers them (no server)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import pytest

from reclaimd.cluster import claims, errors, gangs
from reclaimd.cluster.cache import ClusterCache, TakingTurns, _Stream
from reclaimd.cluster.indexes import (
    CLAIM_ANNOTATION,
    NodeView,
    node_record,
    pod_record,
    slim_pod,
)
from reclaimd.cluster.watch import Changed, Listed
from reclaimd.model import GangKey, Target, WorkloadRef, utcnow
from reclaimd.settings.cache import CacheSettings
from reclaimd.settings.watch import WatchSettings

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
    assert cache.view.node("a") == NodeView(
        name="a",
        resource_version="41",
        unschedulable=False,
        taints=(),
        claim_text=None,
        labels={"sku": "h100"},
    )
    assert cache.view.node("missing") is None


def test_node_view_carries_taints_cordon_and_the_raw_claim() -> None:
    cache = new_cache()
    odd = {"key": "gpu", "effect": "NoExecute", "value": None, "extra": "dropped"}
    cache._on_node(
        Listed((node("a", "41", unschedulable=True, taints=[SPOT_TAINT, odd], claim=CLAIM),), "50")
    )
    view = cache.view.node("a")
    assert view is not None
    assert view.resource_version == "41"
    assert view.unschedulable is True
    assert view.taints == (SPOT_TAINT, {"key": "gpu", "effect": "NoExecute"})
    assert view.claim_text == CLAIM


def test_watch_events_update_and_delete_the_view() -> None:
    cache = new_cache()
    cache._on_node(Listed((node("a", "41"),), "50"))
    cache._on_node(Changed("MODIFIED", node("a", "52", unschedulable=True, claim=CLAIM)))
    view = cache.view.node("a")
    assert view is not None
    assert (view.resource_version, view.unschedulable, view.claim_text) == ("52", True, CLAIM)
    cache._on_node(Changed("MODIFIED", node("a", "53", unschedulable=False)))
    view = cache.view.node("a")
    assert view is not None
    assert (view.resource_version, view.unschedulable, view.claim_text) == ("53", False, None)
    cache._on_node(Changed("DELETED", node("a", "54")))
    assert cache.view.node("a") is None
    assert cache.view.resolve_node(Target(instance_id="i-a")) is None


def test_a_relist_replaces_the_views() -> None:
    cache = new_cache()
    cache._on_node(Listed((node("a", "41"), node("b", "42")), "50"))
    cache._on_node(Listed((node("b", "60", claim=CLAIM),), "61"))
    assert cache.view.node("a") is None
    view = cache.view.node("b")
    assert view is not None
    assert (view.resource_version, view.claim_text) == ("60", CLAIM)


def test_node_view_is_frozen_and_editing_its_taints_leaves_the_cache_alone() -> None:
    cache = new_cache()
    cache._on_node(Listed((node("a", "41", taints=[SPOT_TAINT]),), "50"))
    view = cache.view.node("a")
    assert view is not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.unschedulable = True  # type: ignore[misc]
    view.taints[0]["value"] = "edited"
    again = cache.view.node("a")
    assert again is not None
    assert again.taints == (SPOT_TAINT,)


# --- pods -------------------------------------------------------------------------------------

NS = "team-b"


def gpu_pod(
    name: str,
    node: str,
    *,
    job: str = "train",
    gpus: int = 8,
    phase: str = "Running",
    rank: int = 0,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A pod as the server lists it, with the bulk the cache must not keep."""
    return {
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": f"uid-{name}",
            "resourceVersion": "7",
            "labels": {
                gangs.JOB_NAME: job,
                gangs.COMPLETION_INDEX: str(rank),
                "team": "vision",
                **(labels or {}),
            },
            "annotations": {
                "reclaimd.io/checkpoint-url": "http://{pod_ip}:8080/ckpt",
                "kubectl.kubernetes.io/last-applied-configuration": "{" + "x" * 2000 + "}",
            },
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": job,
                    "uid": f"uid-{job}",
                    "controller": True,
                }
            ],
            "managedFields": [{"manager": "kube-controller-manager", "fieldsV1": {"f:spec": {}}}],
        },
        "spec": {
            "nodeName": node,
            "volumes": [{"name": "data", "emptyDir": {}}],
            "initContainers": [
                {
                    "name": "sidecar",
                    "restartPolicy": "Always",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
            "containers": [
                {
                    "name": "main",
                    "image": "trainer:1",
                    "env": [{"name": "A", "value": "b"}],
                    "resources": {
                        "requests": {"cpu": "40", "memory": "400Gi", "nvidia.com/gpu": str(gpus)},
                        "limits": {"memory": "400Gi", "nvidia.com/gpu": str(gpus)},
                    },
                }
            ],
        },
        "status": {
            "phase": phase,
            "podIP": f"10.0.0.{rank + 1}",
            "startTime": "2026-05-01T10:00:00Z",
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def cpu_pod(name: str, node: str) -> dict[str, Any]:
    p = gpu_pod(name, node, job="web")
    for c in p["spec"]["containers"] + p["spec"]["initContainers"]:
        c["resources"] = {"requests": {"cpu": "1"}}
    return p


def fleet() -> list[dict[str, Any]]:
    return [
        gpu_pod("train-0", "n1", rank=0),
        gpu_pod("train-1", "n2", rank=1),
        gpu_pod("other-0", "n2", job="other"),
        cpu_pod("web-0", "n1"),
        gpu_pod("done-0", "n1", job="done", phase="Succeeded"),
    ]


def listed_raw(objects: list[dict[str, Any]]) -> Listed:
    return Listed(tuple(objects), "100")


def listed_projected(objects: list[dict[str, Any]]) -> Listed:
    """As ``KubeEndpoint(project=pod_record)`` hands it over."""
    return Listed(tuple(r for r in map(pod_record, objects) if r is not None), "100")


@pytest.mark.parametrize("listed", [listed_raw, listed_projected])
def test_gpu_pods_are_indexed_from_raw_or_projected_lists(
    listed: Callable[[list[dict[str, Any]]], Listed],
) -> None:
    cache = new_cache()
    cache._pod_applier("")(listed(fleet()))
    assert cache.sizes()["pods"] == 3
    assert not cache.view.pod_exists(NS, "web-0")
    assert not cache.view.pod_exists(NS, "done-0")
    assert cache.view.pod_exists(NS, "train-0", "uid-train-0")
    assert not cache.view.pod_exists(NS, "train-0", "uid-someone-else")

    (train,) = cache.view.gangs_on_nodes(["n1"])
    assert train.key == GangKey("job", NS, "train")
    assert [(m.name, m.node, m.rank, m.gpus) for m in train.members] == [
        ("train-0", "n1", 0, 9),
        ("train-1", "n2", 1, 9),
    ]
    assert train.members[0].checkpoint_url == "http://10.0.0.1:8080/ckpt"
    assert [g.key.name for g in cache.view.gangs_on_nodes(["n2"])] == ["other", "train"]


def test_gpu_pods_lists_every_cached_gpu_pod_in_slim_form() -> None:
    cache = new_cache()
    cache._pod_applier("")(listed_projected(fleet()))
    pods = sorted(cache.view.gpu_pods(), key=gangs.name_of)
    assert [gangs.name_of(p) for p in pods] == ["other-0", "train-0", "train-1"]
    assert pods[1] == slim_pod(gpu_pod("train-0", "n1"))


def test_projected_and_raw_lists_build_the_same_gangs() -> None:
    raw, projected = new_cache(), new_cache()
    raw._pod_applier("")(listed_raw(fleet()))
    projected._pod_applier("")(listed_projected(fleet()))
    assert raw.view.gangs_on_nodes(["n1", "n2"]) == projected.view.gangs_on_nodes(["n1", "n2"])


def test_the_record_keeps_what_the_gang_logic_reads_and_nothing_bulky() -> None:
    raw = gpu_pod("train-0", "n1")
    record = pod_record(raw)
    assert record is not None
    kept = record.decode()
    assert gangs.gpu_count(kept) == gangs.gpu_count(raw) == 9
    assert gangs.gang_key(kept) == gangs.gang_key(raw)
    assert gangs.owner_uids(kept) == gangs.owner_uids(raw)
    assert kept["metadata"]["labels"] == raw["metadata"]["labels"]
    assert set(kept["metadata"]["annotations"]) == {"reclaimd.io/checkpoint-url"}
    assert "managedFields" not in kept["metadata"]
    assert kept["spec"]["containers"] == [
        {
            "name": "main",
            "resources": {"limits": {"nvidia.com/gpu": "8"}, "requests": {"nvidia.com/gpu": "8"}},
        }
    ]
    assert kept["status"] == {
        "phase": "Running",
        "podIP": "10.0.0.1",
        "startTime": "2026-05-01T10:00:00Z",
    }
    assert pod_record(cpu_pod("web-0", "n1")) is None


def test_watch_events_move_finish_and_delete_pods() -> None:
    cache = new_cache()
    apply = cache._pod_applier("")
    apply(listed_projected(fleet()))
    apply(Changed("MODIFIED", gpu_pod("train-1", "n3", rank=1)))  # rescheduled elsewhere
    assert [g.key.name for g in cache.view.gangs_on_nodes(["n2"])] == ["other"]
    assert [m.node for m in cache.view.gangs_on_nodes(["n3"])[0].members] == ["n1", "n3"]
    apply(Changed("MODIFIED", gpu_pod("train-0", "n1", phase="Failed")))  # finished: dropped
    assert not cache.view.pod_exists(NS, "train-0")
    assert cache.view.gangs_on_nodes(["n1"]) == ()
    apply(Changed("DELETED", gpu_pod("train-1", "n3", rank=1)))
    assert cache.view.gang(GangKey("job", NS, "train")) is None
    assert cache._idx.by_node.keys() == {"n2"}
    assert cache._idx.by_owner_uid.keys() == {(NS, "uid-other")}


def test_a_relist_of_one_namespace_replaces_only_its_pods() -> None:
    cache = new_cache()
    apply = cache._pod_applier(NS)
    apply(listed_projected(fleet()))
    elsewhere = gpu_pod("far-0", "n9", job="far")
    elsewhere["metadata"]["namespace"] = "team-c"
    cache._pod_applier("team-c")(listed_projected([elsewhere]))
    apply(listed_projected([gpu_pod("other-0", "n2", job="other")]))
    assert cache.sizes()["pods"] == 2
    assert cache.view.pod_exists("team-c", "far-0")
    assert not cache.view.pod_exists(NS, "train-0")


def test_pods_reach_their_kueue_workload_through_the_job_uid() -> None:
    cache = new_cache()
    cache._pod_applier("")(listed_projected(fleet()))
    cache._workload_applier("")(
        Listed(
            (
                {
                    "metadata": {
                        "namespace": NS,
                        "name": "job-train-abc",
                        "uid": "wl-uid",
                        "labels": {gangs.KUEUE_JOB_UID: "uid-train"},
                    }
                },
            ),
            "5",
        )
    )
    (gang,) = cache.view.gangs_of_workload(WorkloadRef(NS, "job-train-abc"))
    assert gang.key == GangKey("job", NS, "train")


def test_node_records_share_label_strings_across_nodes() -> None:
    # Separate decodes, as two watch events or LIST pages: equal strings, distinct objects.
    a = node_record(json.loads(json.dumps(node("a", "1"))))
    b = node_record(json.loads(json.dumps(node("b", "2"))))
    assert a is not None and b is not None
    (ka, va), (kb, vb) = next(iter(a.labels.items())), next(iter(b.labels.items()))
    assert ka is kb and va is vb


async def test_lists_take_turns_but_watches_do_not_wait() -> None:
    turn = asyncio.Lock()
    inside: list[str] = []
    overlapped: list[bool] = []

    class Slow:
        def __init__(self, name: str) -> None:
            self.name = name

        async def list(self) -> tuple[list[Any], str]:
            overlapped.append(bool(inside))
            inside.append(self.name)
            await asyncio.sleep(0.01)
            inside.remove(self.name)
            return [self.name], "1"

        def watch(self, resource_version: str, timeout_s: int) -> Any:
            return (self.name, resource_version)

    a, b = TakingTurns(Slow("a"), turn), TakingTurns(Slow("b"), turn)
    results = await asyncio.gather(a.list(), b.list(), a.list())
    assert results == [(["a"], "1"), (["b"], "1"), (["a"], "1")]
    assert overlapped == [False, False, False]
    async with turn:  # a LIST in progress elsewhere
        assert b.watch("7", 30) == ("b", "7")


FAST_WATCH = WatchSettings(backoff_base_s=0.01, backoff_cap_s=0.02)


# --- supervision -------------------------------------------------------------------------


class StuckOnce:
    """A LIST that hangs forever the first time (a half-open connection), then answers."""

    def __init__(self) -> None:
        self.lists = 0

    async def list(self) -> tuple[list[Any], str]:
        self.lists += 1
        if self.lists == 1:
            await asyncio.sleep(3600)
        return [], "1"

    @contextlib.asynccontextmanager
    async def watch(self, resource_version: str, timeout_s: int) -> AsyncIterator[Any]:
        async def quiet() -> AsyncIterator[Any]:
            while True:
                await asyncio.sleep(0.01)
                yield {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "1"}}}

        yield quiet()


class Unreachable(StuckOnce):
    async def list(self) -> tuple[list[Any], str]:
        self.lists += 1
        raise errors.ServerError("list nodes", 0, "ClientConnectorError")


def supervised(endpoint: Any) -> ClusterCache:
    settings = CacheSettings(stall_after_s=0.2, supervise_interval_s=0.05, watch=FAST_WATCH)
    view = ClusterCache(cast(Any, None), settings=settings)
    view._begin([_Stream("nodes", endpoint, lambda event: None, False)])
    return view


async def test_a_stuck_watch_is_restarted_and_the_cache_becomes_current() -> None:
    endpoint = StuckOnce()
    view = supervised(endpoint)
    supervisor = asyncio.create_task(view.run())
    try:
        assert not view.current and view.why_not_current() == "not listed yet"
        assert await view.wait_synced(5.0)
        assert view.current and view.restarts == 1 and endpoint.lists == 2
    finally:
        supervisor.cancel()
        await view.stop()


async def test_a_watch_that_cannot_reach_the_server_is_not_current() -> None:
    view = supervised(Unreachable())
    view._listed("nodes")  # as if listed before the API server went away
    try:
        for _ in range(100):
            await asyncio.sleep(0.01)
            if view.why_not_current():
                break
        assert not view.current and "ClientConnectorError" in view.why_not_current()
    finally:
        await view.stop()


def test_the_cache_remembers_when_each_pod_left() -> None:
    cache = new_cache()
    apply = cache._pod_applier("")
    apply(listed_projected(fleet()))
    uid = next(p.uid for p in cache._idx.pods.values() if p.pid == (NS, "train-1"))
    assert uid and cache.view.pod_gone_at(uid) is None
    apply(Changed("MODIFIED", gpu_pod("train-1", "n3", rank=1)))  # still there: not gone
    assert cache.view.pod_gone_at(uid) is None
    before = utcnow()
    apply(Changed("DELETED", gpu_pod("train-1", "n3", rank=1)))
    gone = cache.view.pod_gone_at(uid)
    assert gone is not None and before <= gone <= utcnow()
    apply(listed_projected(fleet()))  # a relist that has it again: back
    assert cache.view.pod_gone_at(uid) is None
    assert cache.view.pod_gone_at("") is None


def test_a_gang_whose_pods_left_after_the_notice_is_still_found() -> None:
    """Kueue deletes a reclaimed Workload's pods itself, a dead owner may have evicted some:
    with ``since`` (the notice's issue time) the gang is found with the ranks that left
    since, and without it (or for pods gone before) it is not."""
    cache = new_cache()
    apply = cache._pod_applier("")
    apply(listed_projected(fleet()))
    ref = _kueue_workload(cache)
    apply(Changed("DELETED", gpu_pod("other-0", "n2", job="other")))  # gone before the notice
    issued = utcnow()
    apply(Changed("DELETED", gpu_pod("train-0", "n1", rank=0)))
    apply(Changed("DELETED", gpu_pod("train-1", "n2", rank=1)))
    assert cache.view.gangs_of_workload(ref) == ()  # today's pods only: none left
    (gang,) = cache.view.gangs_of_workload(ref, since=issued)
    assert gang.key == GangKey("job", NS, "train")
    assert sorted(m.name for m in gang.members) == ["train-0", "train-1"]
    assert all(not m.checkpoint_url for m in gang.members)  # charged, never asked
    assert cache.view.gangs_of_workload(WorkloadRef(NS, "wl-other"), since=issued) == ()
    # a node notice: the rank that was on n1, and its whole gang (train-1 ran on n2)
    (on_n1,) = cache.view.gangs_on_nodes(["n1"], since=issued)
    assert sorted(m.name for m in on_n1.members) == ["train-0", "train-1"]
    assert [g.key.name for g in cache.view.gangs_on_nodes(["n2"], since=issued)] == ["train"]
    assert cache.view.gangs_on_nodes(["n1"], since=utcnow()) == ()


def test_a_gang_half_gone_has_its_live_and_its_gone_ranks_once() -> None:
    cache = new_cache()
    apply = cache._pod_applier("")
    apply(listed_projected(fleet()))
    issued = utcnow()
    apply(Changed("DELETED", gpu_pod("train-0", "n1", rank=0)))
    found = {g.key.name: g for g in cache.view.gangs_on_nodes(["n2"], since=issued)}
    assert sorted(found) == ["other", "train"]
    urls = {m.name: m.checkpoint_url for m in found["train"].members}
    assert sorted(urls) == ["train-0", "train-1"]
    assert not urls["train-0"] and urls["train-1"]  # the one left is not asked, the live one is


def _kueue_workload(cache: ClusterCache) -> WorkloadRef:
    cache._workload_applier("")(
        Listed(
            ({"metadata": {"namespace": NS, "name": "wl-train", "uid": "wl-uid",
                           "labels": {gangs.KUEUE_JOB_UID: "uid-train"}}},),
            "5",
        )
    )  # fmt: skip
    return WorkloadRef(NS, "wl-train")


async def test_a_restarted_process_finds_the_gang_whose_pods_left_while_it_was_down(
    tmp_path: Any,
) -> None:
    """The last process wrote its pods to its disk; the pods of a reclaimed Workload went
    while no process ran. The next one, on that disk, counts every snapshot pod its first
    LIST lacks as gone when it started: the notice issued before finds its whole gang. A pod
    that left before the notice (by the snapshot's own record) is not the notice's."""
    path = tmp_path / "pods.snapshot"
    first = ClusterCache(cast(Any, None), settings=CacheSettings(snapshot_path=path))
    apply = first._pod_applier("")
    apply(listed_projected(fleet()))
    apply(Changed("DELETED", gpu_pod("other-0", "n2", job="other")))  # left, long before
    await first._save()
    assert not path.exists()  # nothing written before the first LIST of every stream
    first._synced_event.set()
    await first._save()
    assert path.exists()

    issued = utcnow()  # the reclaim; then Kueue deletes train-0 and train-1, nobody watching
    second = ClusterCache(cast(Any, None), settings=CacheSettings(snapshot_path=path))
    second._snapshot.restore()
    started = utcnow()
    ref = _kueue_workload(second)
    second._pod_applier("")(
        listed_projected([p for p in fleet() if p["metadata"]["name"] in ("web-0", "done-0")])
    )
    (gang,) = second.view.gangs_of_workload(ref, since=issued)
    assert sorted(m.name for m in gang.members) == ["train-0", "train-1"]
    assert all(not m.checkpoint_url for m in gang.members)  # charged, never asked
    for m in gang.members:
        gone = second.view.pod_gone_at(m.uid)
        assert gone is not None and issued <= gone <= started
    # left before the notice, by the snapshot's record: not the notice's
    assert [g.key.name for g in second.view.gangs_on_nodes(["n2"], since=issued)] == ["train"]

    # Without the snapshot (a fresh disk) nothing is known of them.
    fresh = ClusterCache(cast(Any, None), settings=CacheSettings(snapshot_path=tmp_path / "x"))
    fresh._snapshot.restore()
    ref = _kueue_workload(fresh)
    fresh._pod_applier("")(listed_projected([]))
    assert fresh.view.gangs_of_workload(ref, since=issued) == ()


def test_a_damaged_or_foreign_snapshot_is_ignored(tmp_path: Any) -> None:
    path = tmp_path / "pods.snapshot"
    for text in ("", "not json\n", '{"format": 99}\n', '{"format": 1}\n{"gone": 5}\n'):
        path.write_text(text)
        cache = ClusterCache(cast(Any, None), settings=CacheSettings(snapshot_path=path))
        cache._snapshot.restore()
        assert cache._idx.gone == {}


# --- what start() watches ------------------------------------------------------------------------


class Discovering:
    """``ApiServer`` as far as start() goes: discovery answers (Kueue serves v1beta1 only),
    every LIST waits for ever; each GET kept as (path, query)."""

    def __init__(self) -> None:
        self.gets: list[tuple[str, dict[str, Any]]] = []

    async def get(self, path: str, **query: Any) -> dict[str, Any]:
        self.gets.append((path, query))
        if path == "/apis":
            kueue = {"groupVersion": "kueue.x-k8s.io/v1beta1", "version": "v1beta1"}
            return {"groups": [{"name": "kueue.x-k8s.io", "versions": [kueue]}]}
        await asyncio.Event().wait()
        return {}


def watched(cache: ClusterCache) -> dict[str, str]:
    """Each stream's path: a ``KubeEndpoint`` inside its ``TakingTurns``."""
    turns: dict[str, Any] = {name: s.endpoint for name, s in cache._streams.items()}
    return {name: e._endpoint._path for name, e in turns.items()}


@pytest.mark.parametrize(
    ("namespaces", "paths"),
    [
        (
            (),
            {
                "nodes": "/api/v1/nodes",
                "pods/": "/api/v1/pods",
                "pdbs/": "/apis/policy/v1/poddisruptionbudgets",
                "workloads/": "/apis/kueue.x-k8s.io/v1beta1/workloads",
            },
        ),
        (
            ("team-b",),
            {
                "nodes": "/api/v1/nodes",
                "pods/team-b": "/api/v1/namespaces/team-b/pods",
                "pdbs/team-b": "/apis/policy/v1/namespaces/team-b/poddisruptionbudgets",
                "workloads/team-b": "/apis/kueue.x-k8s.io/v1beta1/namespaces/team-b/workloads",
            },
        ),
    ],
)
async def test_start_watches_each_collection_at_its_path(
    namespaces: tuple[str, ...], paths: dict[str, str]
) -> None:
    api = Discovering()
    settings = CacheSettings(namespaces=namespaces, watch=WatchSettings(page_size=250))
    cache = ClusterCache(cast(Any, api), settings=settings)
    await cache.start()
    try:
        assert watched(cache) == paths
        for _ in range(100):  # the first LIST (they take turns: one at a time)
            if len(api.gets) > 1:
                break
            await asyncio.sleep(0.01)
        assert api.gets[0] == ("/apis", {})
        path, query = api.gets[1]
        assert path in paths.values() and query == {"limit": 250}
    finally:
        await cache.stop()
