"""Pod -> gang key, rank, leader, GPUs and checkpoint contract (reclaimd.cluster.gangs)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest
from shared_fixtures import FIXTURES as SHARED

from reclaimd.cluster import gangs
from reclaimd.model import CheckpointScope, GangKey

FIXTURES = SHARED
IDENTITY = json.loads((FIXTURES / "kueue" / "pod-gang-identity-keys.json").read_text())

NS = "team-b"


def clean(values: Mapping[str, str]) -> dict[str, str]:
    """The fixture's values carry notes in parentheses: keep the value."""
    return {k: v.split(" (")[0] for k, v in values.items()}


def pod(
    name: str = "p0",
    *,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    owners: list[dict[str, Any]] | None = None,
    gpus: int | str = 8,
    resource: str = "nvidia.com/gpu",
    node: str = "node-a",
    ip: str = "10.0.0.5",
    phase: str = "Running",
    start: str = "2026-05-01T10:00:00Z",
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": f"uid-{name}",
            "labels": dict(labels or {}),
            "annotations": dict(annotations or {}),
            "ownerReferences": owners or [],
        },
        "spec": {
            "nodeName": node,
            "containers": [{"name": "main", "resources": {"limits": {resource: str(gpus)}}}],
        },
        "status": {"phase": phase, "podIP": ip, "startTime": start},
    }


def owner(kind: str, name: str, uid: str = "owner-uid") -> dict[str, Any]:
    return {"apiVersion": "x/v1", "kind": kind, "name": name, "uid": uid, "controller": True}


# --- gang keys from the recorded integration metadata ------------------------------------------


def test_kueue_batch_job_with_tas_annotation_groups_by_workload() -> None:
    fx = IDENTITY["batch_job_admitted_by_kueue"]
    p = pod(
        labels=clean(fx["labels"]),
        annotations=clean(fx["annotations"]),
        owners=[owner("Job", "train-b")],
    )
    assert gangs.gang_key(p) == GangKey("kueue", NS, "job-train-b-f1c5a")


def test_kueue_batch_job_without_tas_groups_by_job_name() -> None:
    fx = IDENTITY["batch_job_admitted_by_kueue"]
    p = pod(labels=clean(fx["labels"]), owners=[owner("Job", "train-b")])
    assert gangs.gang_key(p) == GangKey("job", NS, "train-b")


def test_kueue_plain_pod_group_is_the_workload() -> None:
    fx = IDENTITY["kueue_plain_pod_group"]
    p = pod(labels=clean(fx["labels"]), annotations=clean(fx["annotations"]))
    assert gangs.gang_key(p) == GangKey("kueue", NS, "my-group")
    assert gangs.workload_names(p) == frozenset({"my-group"})


def test_lws_under_kueue_uses_the_group_workload_and_marks_the_leader() -> None:
    fx = IDENTITY["leaderworkerset_via_kueue_observed_in_kueue_e2e"]
    p = pod(labels=fx["labels"], annotations=fx["annotations"])
    assert gangs.gang_key(p) == GangKey("kueue", NS, "leaderworkerset-lws-0-ca73b")
    m = gangs.member_of(p)
    assert m.rank == 0
    assert m.is_leader


def test_lws_without_kueue_is_one_gang_per_group() -> None:
    fx = IDENTITY["leaderworkerset_via_kueue_observed_in_kueue_e2e"]
    lws = {k: v for k, v in fx["labels"].items() if k.startswith("leaderworkerset.")}
    g0 = pod("lws-0-1", labels={**lws, gangs.LWS_WORKER_INDEX: "1"})
    g1 = pod("lws-1-1", labels={**lws, gangs.LWS_GROUP_INDEX: "1", gangs.LWS_WORKER_INDEX: "1"})
    assert gangs.gang_key(g0) == GangKey("lws", NS, "lws-0")
    assert gangs.gang_key(g1) == GangKey("lws", NS, "lws-1")
    assert not gangs.member_of(g0).is_leader
    assert gangs.member_of(g0).rank == 1


@pytest.mark.parametrize(
    ("section", "marker", "where", "kind"),
    [
        ("jobset", "jobset.sigs.k8s.io/jobset-name", "labels", "jobset"),
        ("kubeflow_training_operator_v1", "training.kubeflow.org/job-name", "labels", "kubeflow"),
        ("volcano_vcjob", "scheduling.k8s.io/group-name", "annotations", "volcano"),
        ("volcano_vcjob", "volcano.sh/job-name", "labels", "volcano"),
        ("scheduler_plugins_coscheduling", "scheduling.x-k8s.io/pod-group", "labels", "podgroup"),
    ],
)
def test_framework_markers_from_the_fixture(
    section: str, marker: str, where: str, kind: str
) -> None:
    fx = IDENTITY[section]
    listed = fx.get("labels_and_annotations") or fx.get(where) or []
    assert any(k.startswith(marker) for k in listed), f"{marker} not in fixture {section}"
    value = {marker: "train-x"}
    jobs = [owner("Job", "child")]
    p = pod(labels=value, owners=jobs) if where == "labels" else pod(annotations=value, owners=jobs)
    assert gangs.gang_key(p) == GangKey(kind, NS, "train-x")


@pytest.mark.parametrize(
    ("labels", "annotations", "expected"),
    [
        # Kueue's pod group outranks the framework that created the pod.
        ({gangs.KUEUE_POD_GROUP: "wl", gangs.JOBSET_NAME: "js"}, {}, GangKey("kueue", NS, "wl")),
        (
            {gangs.JOBSET_NAME: "js", gangs.JOB_NAME: "js-workers-0"},
            {},
            GangKey("jobset", NS, "js"),
        ),
        (
            {gangs.KUBEFLOW_JOB: "pt"},
            {gangs.VOLCANO_GROUP: "pt-123"},
            GangKey("kubeflow", NS, "pt"),
        ),
        ({gangs.PODGROUP: "pg", gangs.JOB_NAME: "j"}, {}, GangKey("podgroup", NS, "pg")),
        ({gangs.PODGROUP_LEGACY: "old-pg"}, {}, GangKey("podgroup", NS, "old-pg")),
        ({gangs.JOB_NAME_LEGACY: "legacy"}, {}, GangKey("job", NS, "legacy")),
        ({gangs.JOB_UID: "1234"}, {}, GangKey("job", NS, "uid-1234")),
        ({}, {gangs.VOLCANO_GROUP: "vc-abc"}, GangKey("volcano", NS, "vc-abc")),
    ],
)
def test_priority_between_markers(
    labels: dict[str, str], annotations: dict[str, str], expected: GangKey
) -> None:
    assert gangs.gang_key(pod(labels=labels, annotations=annotations)) == expected


def test_controlling_owner_is_the_gang_but_replicas_are_not() -> None:
    sts = pod("db-0", owners=[owner("StatefulSet", "trainer")])
    assert gangs.gang_key(sts) == GangKey("owner", NS, "statefulset/trainer")
    rs = pod("web-abc", owners=[owner("ReplicaSet", "web-5d4")])
    assert gangs.gang_key(rs) == GangKey("pod", NS, "web-abc")
    ds = pod("agent-x", owners=[owner("DaemonSet", "agent")])
    assert gangs.gang_key(ds) == GangKey("pod", NS, "agent-x")
    non_controller = pod("solo", owners=[{**owner("Job", "j"), "controller": False}])
    assert gangs.gang_key(non_controller) == GangKey("pod", NS, "solo")


def test_owner_uids_link_pods_to_a_workload_job_uid() -> None:
    p = pod(
        labels={gangs.JOB_UID: "job-uid", gangs.JOBSET_UID: "js-uid"},
        owners=[owner("Job", "j", uid="job-uid")],
    )
    assert gangs.owner_uids(p) == frozenset({"job-uid", "js-uid"})


# --- ranks and leaders ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("labels", "annotations", "rank"),
    [
        ({gangs.COMPLETION_INDEX: "3"}, {}, 3),
        ({gangs.COMPLETION_INDEX: "3"}, {"reclaimd.io/rank": "7"}, 7),
        ({gangs.LWS_NAME: "l", gangs.LWS_WORKER_INDEX: "2"}, {}, 2),
        ({gangs.POD_INDEX: "4"}, {}, 4),
        ({}, {gangs.COMPLETION_INDEX: "5"}, 5),  # Job sets it as an annotation too
        ({gangs.COMPLETION_INDEX: "x"}, {}, None),
        ({}, {}, None),
    ],
)
def test_rank_from_the_pod_alone(
    labels: dict[str, str], annotations: dict[str, str], rank: int | None
) -> None:
    assert gangs.member_of(pod(labels=labels, annotations=annotations)).rank == rank


def kubeflow(name: str, rtype: str, index: int) -> dict[str, Any]:
    return pod(
        name,
        labels={
            gangs.KUBEFLOW_JOB: "pt",
            gangs.KUBEFLOW_REPLICA_TYPE: rtype,
            gangs.KUBEFLOW_REPLICA_INDEX: str(index),
        },
    )


def test_kubeflow_workers_rank_after_the_master() -> None:
    g = gangs.build_gang(
        GangKey("kubeflow", NS, "pt"),
        [
            kubeflow("pt-worker-1", "worker", 1),
            kubeflow("pt-master-0", "master", 0),
            kubeflow("pt-worker-0", "worker", 0),
        ],
    )
    assert [(m.name, m.rank, m.is_leader) for m in g.members] == [
        ("pt-master-0", 0, True),
        ("pt-worker-0", 1, False),
        ("pt-worker-1", 2, False),
    ]


def test_kubeflow_workers_without_a_master_keep_their_index() -> None:
    g = gangs.build_gang(
        GangKey("kubeflow", NS, "mpi"), [kubeflow("w-0", "worker", 0), kubeflow("w-1", "worker", 1)]
    )
    assert [(m.rank, m.is_leader) for m in g.members] == [(0, True), (1, False)]


def jobset(name: str, global_index: int, completion: int) -> dict[str, Any]:
    return pod(
        name,
        labels={
            gangs.JOBSET_NAME: "js",
            gangs.JOBSET_GLOBAL_INDEX: str(global_index),
            gangs.COMPLETION_INDEX: str(completion),
        },
    )


def test_jobset_rank_is_the_global_job_index() -> None:
    g = gangs.build_gang(
        GangKey("jobset", NS, "js"),
        [jobset("js-w-0-0", 0, 0), jobset("js-w-1-0", 1, 0), jobset("js-w-2-0", 2, 0)],
    )
    assert [(m.name, m.rank) for m in g.members] == [
        ("js-w-0-0", 0),
        ("js-w-1-0", 1),
        ("js-w-2-0", 2),
    ]


def test_jobset_with_several_pods_per_job_counts_across_jobs() -> None:
    g = gangs.build_gang(
        GangKey("jobset", NS, "js"),
        [jobset("b1", 1, 1), jobset("a0", 0, 0), jobset("a1", 0, 1), jobset("b0", 1, 0)],
    )
    assert [(m.name, m.rank) for m in g.members] == [("a0", 0), ("a1", 1), ("b0", 2), ("b1", 3)]


def test_leader_falls_back_to_the_lowest_rank_and_explicit_leader_wins() -> None:
    key = GangKey("job", NS, "j")
    ranked = [
        pod(f"j-{i}", labels={gangs.JOB_NAME: "j", gangs.COMPLETION_INDEX: str(i)})
        for i in (2, 0, 1)
    ]
    g = gangs.build_gang(key, ranked)
    assert [m.name for m in g.members if m.is_leader] == ["j-0"]
    ranked[0]["metadata"]["annotations"]["reclaimd.io/leader"] = "true"
    g = gangs.build_gang(key, ranked)
    assert [m.name for m in g.members if m.is_leader] == ["j-2"]


def test_unranked_gang_still_gets_exactly_one_leader() -> None:
    g = gangs.build_gang(GangKey("owner", NS, "x"), [pod("b"), pod("a")])
    assert [(m.name, m.is_leader, m.rank) for m in g.members] == [
        ("a", True, None),
        ("b", False, None),
    ]


# --- scope and labels ----------------------------------------------------------------------------


def test_scope_is_the_leaders_else_any_members_else_rank() -> None:
    key = GangKey("job", NS, "j")
    leader = pod(
        "j-0",
        labels={gangs.COMPLETION_INDEX: "0"},
        annotations={"reclaimd.io/checkpoint-scope": "leader"},
    )
    worker = pod(
        "j-1",
        labels={gangs.COMPLETION_INDEX: "1"},
        annotations={"reclaimd.io/checkpoint-scope": "rank"},
    )
    assert gangs.build_gang(key, [worker, leader]).scope is CheckpointScope.LEADER
    plain_leader = pod("j-0", labels={gangs.COMPLETION_INDEX: "0"})
    leader_scoped_worker = pod(
        "j-1",
        labels={gangs.COMPLETION_INDEX: "1"},
        annotations={"reclaimd.io/checkpoint-scope": "Leader"},
    )
    assert (
        gangs.build_gang(key, [plain_leader, leader_scoped_worker]).scope is CheckpointScope.LEADER
    )
    assert gangs.build_gang(key, [plain_leader]).scope is CheckpointScope.RANK


def test_labeler_sees_the_leader_pod_and_its_node() -> None:
    calls: list[tuple[dict[str, str], dict[str, str]]] = []

    def labeler(pod_labels: Mapping[str, str], node_labels: Mapping[str, str]) -> dict[str, str]:
        calls.append((dict(pod_labels), dict(node_labels)))
        return {"tenant": pod_labels.get("tenant", ""), "sku": node_labels.get("sku", "")}

    lead = pod("j-0", labels={"tenant": "t1", gangs.COMPLETION_INDEX: "0"}, node="n1")
    other = pod("j-1", labels={"tenant": "t2", gangs.COMPLETION_INDEX: "1"}, node="n2")
    g = gangs.build_gang(
        GangKey("job", NS, "j"),
        [other, lead],
        labeler=labeler,
        node_labels=lambda n: {"sku": f"h100-{n}"},
    )
    assert dict(g.labels) == {"tenant": "t1", "sku": "h100-n1"}
    assert len(calls) == 1
    assert gangs.build_gang(GangKey("job", NS, "j"), [lead]).labels == {}


def test_gang_totals() -> None:
    g = gangs.build_gang(
        GangKey("job", NS, "j"), [pod("a", gpus=8, node="n1"), pod("b", gpus=4, node="n2")]
    )
    assert g.gpus == 12
    assert g.nodes == frozenset({"n1", "n2"})


# --- GPUs ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("resource", "qty", "gpus"),
    [
        ("nvidia.com/gpu", "8", 8),
        ("amd.com/gpu", "2", 2),
        ("nvidia.com/mig-1g.10gb", "3", 3),
        ("cpu", "16", 0),
        ("example.com/gpu-memory", "4", 0),
        ("nvidia.com/gpu", "lots", 0),
        ("nvidia.com/gpu", "0.5", 0),
    ],
)
def test_gpu_resources(resource: str, qty: str, gpus: int) -> None:
    assert gangs.gpu_count(pod(resource=resource, gpus=qty)) == gpus


def test_gpus_add_over_containers_and_sidecars_but_not_plain_init() -> None:
    p = pod(gpus=2)
    spec = p["spec"]
    spec["containers"].append({"name": "b", "resources": {"requests": {"nvidia.com/gpu": "1"}}})
    spec["initContainers"] = [
        {"name": "warmup", "resources": {"limits": {"nvidia.com/gpu": "2"}}},
        {
            "name": "sidecar",
            "restartPolicy": "Always",
            "resources": {"limits": {"nvidia.com/gpu": "1"}},
        },
    ]
    assert gangs.gpu_count(p) == 4
    spec["initContainers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "6"
    assert gangs.gpu_count(p) == 6


def test_finished_and_cpu_only_pods_are_not_members() -> None:
    assert gangs.is_gang_member(pod())
    assert gangs.is_gang_member(pod(phase="Pending"))
    assert not gangs.is_gang_member(pod(phase="Succeeded"))
    assert not gangs.is_gang_member(pod(phase="Failed"))
    assert not gangs.is_gang_member(pod(resource="cpu"))


# --- the checkpoint contract on a member -------------------------------------------------------


def test_member_carries_the_contract() -> None:
    p = pod(
        "r0",
        labels={gangs.COMPLETION_INDEX: "0"},
        ip="10.1.2.3",
        annotations={
            "reclaimd.io/checkpoint-url": "http://{pod_ip}:8080/checkpoint",
            "reclaimd.io/checkpoint-timeout": "45s",
            "reclaimd.io/last-checkpoint": "2026-05-01T10:30:00Z",
        },
    )
    m = gangs.member_of(p)
    assert m.checkpoint_url == "http://10.1.2.3:8080/checkpoint"
    assert m.checkpoint_timeout_s == 45.0
    assert m.last_checkpoint == datetime(2026, 5, 1, 10, 30, tzinfo=UTC)
    assert m.started_at == datetime(2026, 5, 1, 10, 0, tzinfo=UTC)
    assert (m.namespace, m.name, m.uid, m.node, m.gpus, m.pod_ip) == (
        NS,
        "r0",
        "uid-r0",
        "node-a",
        8,
        "10.1.2.3",
    )


def test_a_stash_is_not_a_last_checkpoint_and_bad_values_degrade() -> None:
    p = pod(
        annotations={
            "reclaimd.io/checkpoint-url": "ftp://{pod_ip}/x",
            "reclaimd.io/checkpoint-timeout": "soon",
            "reclaimd.io/last-checkpoint": "2026-05-01T10:30:00Z",
            "reclaimd.io/checkpoint-durable": "false",
        },
        start="not a time",
    )
    m = gangs.member_of(p)
    assert (m.checkpoint_url, m.checkpoint_timeout_s, m.last_checkpoint, m.started_at) == (
        "",
        0.0,
        None,
        None,
    )


def test_a_pod_is_api_json_and_nothing_else() -> None:
    """Pods come as the API server sends them (the cache's dicts); anything else is refused
    plainly, not read as an empty pod."""
    pod = {"metadata": {"name": "m0", "namespace": NS}}
    assert gangs.as_pod(pod) is pod
    with pytest.raises(TypeError, match="not a pod: object"):
        gangs.as_pod(object())


def test_identity_labels_are_what_a_selector_can_pin_of_the_gang() -> None:
    def pod(labels: dict[str, str], annotations: dict[str, str] | None = None) -> dict[str, Any]:
        meta = {"name": "p", "namespace": "ns", "labels": labels}
        return {"metadata": {**meta, "annotations": annotations or {}}}

    js = gangs.JOBSET_NAME
    assert gangs.identity_labels(pod({js: "g1", "x": "y"})) == ((js, "g1"),)
    lws = pod({gangs.LWS_NAME: "l", gangs.LWS_GROUP_INDEX: "2"})
    assert gangs.identity_labels(lws) == ((gangs.LWS_NAME, "l"), (gangs.LWS_GROUP_INDEX, "2"))
    group = pod({gangs.KUEUE_POD_GROUP: "wl", js: "g1"})  # the pod group names the gang
    assert gangs.identity_labels(group) == ((gangs.KUEUE_POD_GROUP, "wl"),)
    # named by an annotation, an owner or itself: no selector pins it
    assert gangs.identity_labels(pod({}, {js: "g1"})) == ()
    assert gangs.identity_labels(pod({}, {gangs.KUEUE_WORKLOAD: "wl"})) == ()
    assert gangs.identity_labels(pod({"app": "x"})) == ()
