"""Which gang a pod belongs to, its rank, and what the checkpoint contract needs (pure).

A gang is every pod of one multi-pod job. Each integration marks its pods differently, so the
key is taken from the first marker found, most specific first:

1. Kueue pod group (``kueue.x-k8s.io/pod-group-name`` label: the Workload's name; LWS groups
   under Kueue carry it too),
2. Kueue workload (``kueue.x-k8s.io/workload`` annotation, set with topology-aware scheduling),
3. JobSet (``jobset.sigs.k8s.io/jobset-name``),
4. LeaderWorkerSet (``leaderworkerset.sigs.k8s.io/name`` + ``group-index``: one group is one
   gang, the LWS's other groups are independent replicas),
5. Kubeflow training operator (``training.kubeflow.org/job-name``),
6. Volcano (``scheduling.k8s.io/group-name`` annotation, else ``volcano.sh/job-name``),
7. scheduler-plugins coscheduling (``scheduling.x-k8s.io/pod-group`` label, or the legacy
   ``pod-group.scheduling.sigs.k8s.io``),
8. batch Job (``batch.kubernetes.io/job-name``, legacy ``job-name``, else the controller uid),
9. the controlling owner, except ReplicaSets and DaemonSets: their pods are interchangeable
   replicas, and treating a Deployment as a gang would drain every replica for one lost node,
10. the pod alone.

Ranks come from ``reclaimd.io/rank`` when the workload says so, else from the framework's
index labels; ``build_gang`` fills what only the whole gang can tell (a Kubeflow worker's
rank depends on whether a master exists; a gang with no marked leader gets its lowest rank).
Functions take the pod as the API server's JSON (camelCase, as the cache keeps it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from reclaimd import annotations as contract_keys
from reclaimd.annotations import POD_IP_ONLY, UrlPolicy
from reclaimd.cluster import objects
from reclaimd.model import (
    CheckpointScope,
    Gang,
    GangKey,
    Member,
    ParseError,
    frozen_map,
    parse_time,
)

Pod = Mapping[str, Any]
Labeler = Callable[[Mapping[str, str], Mapping[str, str]], Mapping[str, str]]

KUEUE_POD_GROUP = "kueue.x-k8s.io/pod-group-name"
KUEUE_PREBUILT_WORKLOAD = "kueue.x-k8s.io/prebuilt-workload-name"
KUEUE_WORKLOAD = "kueue.x-k8s.io/workload"
KUEUE_JOB_UID = "kueue.x-k8s.io/job-uid"
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
JOBSET_UID = "jobset.sigs.k8s.io/jobset-uid"
JOBSET_GLOBAL_INDEX = "jobset.sigs.k8s.io/job-global-index"
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
LWS_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
KUBEFLOW_JOB = "training.kubeflow.org/job-name"
KUBEFLOW_REPLICA_TYPE = "training.kubeflow.org/replica-type"
KUBEFLOW_REPLICA_INDEX = "training.kubeflow.org/replica-index"
KUBEFLOW_JOB_ROLE = "training.kubeflow.org/job-role"
VOLCANO_GROUP = "scheduling.k8s.io/group-name"
VOLCANO_JOB = "volcano.sh/job-name"
PODGROUP = "scheduling.x-k8s.io/pod-group"
PODGROUP_LEGACY = "pod-group.scheduling.sigs.k8s.io"
JOB_NAME = "batch.kubernetes.io/job-name"
JOB_NAME_LEGACY = "job-name"
JOB_UID = "batch.kubernetes.io/controller-uid"
JOB_UID_LEGACY = "controller-uid"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
POD_INDEX = "apps.kubernetes.io/pod-index"

# Kubeflow replica types that lead a job (PyTorch master, TF chief, MPI launcher).
LEADING_REPLICA_TYPES = frozenset({"master", "chief", "launcher"})
# Owners whose pods are interchangeable replicas, not ranks of one job.
NOT_A_GANG_OWNERS = frozenset({"ReplicaSet", "DaemonSet"})
FINISHED_PHASES = frozenset({"Succeeded", "Failed"})
MIG_PREFIX = "nvidia.com/mig-"


# --- reading a pod ---------------------------------------------------------------------------


def as_pod(pod: Any) -> Pod:
    """The pod as API JSON (a map, as the API server sends it); TypeError for anything else."""
    if isinstance(pod, Mapping):
        return pod
    raise TypeError(f"not a pod: {type(pod).__name__}")


def labels(pod: Pod) -> Mapping[str, str]:
    return objects.part(objects.meta(pod), "labels")


def pod_annotations(pod: Pod) -> Mapping[str, str]:
    return objects.part(objects.meta(pod), "annotations")


def namespace_of(pod: Pod) -> str:
    return str(objects.meta(pod).get("namespace") or "")


name_of = objects.name
uid_of = objects.uid


def node_of(pod: Pod) -> str:
    spec = pod.get("spec")
    return str(spec.get("nodeName") or "") if isinstance(spec, Mapping) else ""


def phase_of(pod: Pod) -> str:
    status = pod.get("status")
    return str(status.get("phase") or "") if isinstance(status, Mapping) else ""


def _status(pod: Pod, key: str) -> str:
    status = pod.get("status")
    return str(status.get(key) or "") if isinstance(status, Mapping) else ""


def controller_of(pod: Pod) -> Mapping[str, Any] | None:
    for ref in objects.meta(pod).get("ownerReferences") or ():
        if isinstance(ref, Mapping) and ref.get("controller"):
            return ref
    return None


def _marker(pod: Pod, key: str) -> str:
    """A label, else the annotation of the same name (integrations differ on which)."""
    value = labels(pod).get(key) or pod_annotations(pod).get(key)
    return str(value).strip() if value else ""


# --- GPUs ------------------------------------------------------------------------------------


def is_gpu_resource(name: str) -> bool:
    return name.endswith("/gpu") or name.startswith(MIG_PREFIX)


def _quantity(value: Any) -> int:
    # Extended resources are whole numbers; anything else is not a GPU count we can use.
    try:
        number = float(str(value).strip())
    except ValueError:
        return 0
    return int(number) if number >= 0 and number == int(number) else 0


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _container_gpus(container: Any) -> int:
    if not isinstance(container, Mapping):
        return 0
    resources = container.get("resources")
    if not isinstance(resources, Mapping):
        return 0
    limits = _mapping(resources.get("limits"))
    requests = _mapping(resources.get("requests"))
    total = 0
    for name in {*limits, *requests}:
        if is_gpu_resource(str(name)):
            # Extended resources cannot be overcommitted: request == limit when both are set.
            total += max(_quantity(limits.get(name, 0)), _quantity(requests.get(name, 0)))
    return total


def gpu_count(pod: Pod) -> int:
    """GPUs (and MIG slices) the pod holds while it runs.

    App containers and sidecars (init containers with ``restartPolicy: Always``) run together,
    so they add up; a plain init container runs alone before them, so it only counts when it
    asks for more than they do, as the scheduler computes it.
    """
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return 0
    running = sum(_container_gpus(c) for c in spec.get("containers") or ())
    init_peak = 0
    for c in spec.get("initContainers") or ():
        if isinstance(c, Mapping) and c.get("restartPolicy") == "Always":
            running += _container_gpus(c)
        else:
            init_peak = max(init_peak, _container_gpus(c))
    return max(running, init_peak)


def is_gang_member(pod: Pod) -> bool:
    """A pod worth tracking: it holds GPUs and has not finished."""
    return phase_of(pod) not in FINISHED_PHASES and gpu_count(pod) > 0


# --- identity ----------------------------------------------------------------------------------


def gang_key(pod: Any) -> GangKey:
    """The gang a pod belongs to, by the first integration marker found (see module doc)."""
    pod = as_pod(pod)
    ns = namespace_of(pod)
    lab, ann = labels(pod), pod_annotations(pod)

    def key(kind: str, name: str) -> GangKey:
        return GangKey(kind, ns, name)

    if value := lab.get(KUEUE_POD_GROUP):
        return key("kueue", value)
    if value := ann.get(KUEUE_WORKLOAD):
        return key("kueue", value)
    if value := _marker(pod, JOBSET_NAME):
        return key("jobset", value)
    if value := _marker(pod, LWS_NAME):
        return key("lws", f"{value}-{_marker(pod, LWS_GROUP_INDEX) or '0'}")
    if value := _marker(pod, KUBEFLOW_JOB):
        return key("kubeflow", value)
    if value := ann.get(VOLCANO_GROUP) or _marker(pod, VOLCANO_JOB):
        return key("volcano", value)
    if value := lab.get(PODGROUP) or lab.get(PODGROUP_LEGACY):
        return key("podgroup", value)
    if value := lab.get(JOB_NAME) or lab.get(JOB_NAME_LEGACY):
        return key("job", value)
    if value := lab.get(JOB_UID) or lab.get(JOB_UID_LEGACY):
        return key("job", f"uid-{value}")
    owner = controller_of(pod)
    if owner is not None and owner.get("kind") not in NOT_A_GANG_OWNERS and owner.get("name"):
        return key("owner", f"{str(owner.get('kind', '')).lower()}/{owner['name']}")
    return key("pod", name_of(pod))


def identity_labels(pod: Any) -> tuple[tuple[str, str], ...]:
    """The labels that name the pod's gang, when ``gang_key`` took it from labels: a selector
    that requires all of them selects this gang's pods and no other's. Empty for a gang named
    by an annotation, an owner or the pod itself (no label selector can pin those)."""
    pod = as_pod(pod)
    lab = labels(pod)
    if lab.get(KUEUE_POD_GROUP):
        return ((KUEUE_POD_GROUP, lab[KUEUE_POD_GROUP]),)
    if pod_annotations(pod).get(KUEUE_WORKLOAD):
        return ()
    for key, also in (
        (JOBSET_NAME, ()),
        (LWS_NAME, (LWS_GROUP_INDEX,)),
        (KUBEFLOW_JOB, ()),
    ):
        if _marker(pod, key):
            pinned = (key, *also)
            if all(lab.get(k) for k in pinned):
                return tuple((k, str(lab[k])) for k in pinned)
            return ()  # named by an annotation: not selectable
    if pod_annotations(pod).get(VOLCANO_GROUP):
        return ()
    for key in (VOLCANO_JOB, PODGROUP, PODGROUP_LEGACY, JOB_NAME, JOB_NAME_LEGACY):
        if lab.get(key):
            return ((key, str(lab[key])),)
    if lab.get(JOB_UID) or lab.get(JOB_UID_LEGACY):
        key = JOB_UID if lab.get(JOB_UID) else JOB_UID_LEGACY
        return ((key, str(lab[key])),)
    return ()


def workload_names(pod: Pod) -> frozenset[str]:
    """Kueue Workload names the pod names itself (pod groups, prebuilt, TAS annotation)."""
    found = {
        labels(pod).get(KUEUE_POD_GROUP),
        labels(pod).get(KUEUE_PREBUILT_WORKLOAD),
        pod_annotations(pod).get(KUEUE_WORKLOAD),
    }
    return frozenset(str(v) for v in found if v)


def owner_uids(pod: Pod) -> frozenset[str]:
    """Uids of the job objects above the pod: a Workload's ``job-uid`` label is one of them."""
    found = {labels(pod).get(k) for k in (JOB_UID, JOB_UID_LEGACY, JOBSET_UID)}
    owner = controller_of(pod)
    if owner is not None:
        found.add(owner.get("uid"))
    return frozenset(str(v) for v in found if v)


def _index(value: str) -> int | None:
    text = value.strip()
    return int(text) if text.isdigit() and text.isascii() else None


def _replica_type(pod: Pod) -> str:
    return _marker(pod, KUBEFLOW_REPLICA_TYPE).lower()


def framework_rank(pod: Pod, *, gang_has_leading_replica: bool = False) -> int | None:
    """The rank a framework label gives, without ``reclaimd.io/rank``.

    A Kubeflow worker's index counts from 0 after the master (PyTorch sets ``RANK`` to
    index + 1 when a master exists), so the caller says whether the gang has one.
    """
    if (kf := _index(_marker(pod, KUBEFLOW_REPLICA_INDEX))) is not None:
        leading = _replica_type(pod) in LEADING_REPLICA_TYPES
        return kf + 1 if gang_has_leading_replica and not leading else kf
    for key in (COMPLETION_INDEX, LWS_WORKER_INDEX, POD_INDEX):
        if (value := _index(_marker(pod, key))) is not None:
            return value
    return None


def framework_leader(pod: Pod) -> bool:
    """The integration marks this pod as its job's leader."""
    if _replica_type(pod) in LEADING_REPLICA_TYPES:
        return True
    if _marker(pod, KUBEFLOW_JOB_ROLE).lower() == "master":
        return True
    return _marker(pod, LWS_NAME) != "" and _marker(pod, LWS_WORKER_INDEX) == "0"


# --- members and gangs -----------------------------------------------------------------------


def ready_since(status: Mapping[str, Any]) -> str:
    """The time the pod's Ready condition turned True ('' when it is not Ready): the slim
    pod's ``readyAt``, else the condition of a full pod."""
    if status.get("readyAt"):
        return str(status["readyAt"])
    for c in status.get("conditions") or ():
        if isinstance(c, Mapping) and c.get("type") == "Ready":
            return str(c.get("lastTransitionTime") or "") if c.get("status") == "True" else ""
    return ""


def _ready_at(pod: Pod) -> datetime | None:
    status = pod.get("status")
    value = ready_since(status) if isinstance(status, Mapping) else ""
    try:
        return parse_time(value) if value else None
    except ParseError:
        return None


def _started_at(pod: Pod) -> datetime | None:
    value = _status(pod, "startTime")
    if not value:
        return None
    try:
        return parse_time(value)
    except ParseError:
        return None


def member_of(
    pod: Any,
    *,
    rank: int | None = None,
    leader: bool | None = None,
    url_policy: UrlPolicy = POD_IP_ONLY,
) -> Member:
    """One pod as a gang member. ``rank``/``leader`` override what the pod alone says;
    ``url_policy`` says which hosts its checkpoint URL may name (default: its own IP)."""
    pod = as_pod(pod)
    ip = _status(pod, "podIP")
    contract = contract_keys.read_pod(
        pod_annotations(pod),
        pod_ip=ip,
        namespace=namespace_of(pod),
        name=name_of(pod),
        policy=url_policy,
    )
    if rank is None:
        rank = contract.rank if contract.rank is not None else framework_rank(pod)
    if leader is None:
        leader = contract.is_leader or framework_leader(pod)
    return Member(
        namespace=namespace_of(pod),
        name=name_of(pod),
        uid=uid_of(pod),
        node=node_of(pod),
        gpus=gpu_count(pod),
        rank=rank,
        pod_ip=ip,
        checkpoint_url=contract.checkpoint_url,
        checkpoint_timeout_s=contract.checkpoint_timeout_s,
        last_checkpoint=contract.last_durable_checkpoint,
        started_at=_started_at(pod),
        ready_at=_ready_at(pod),
        is_leader=leader,
    )


def _explicit_rank(pod: Pod) -> int | None:
    value = pod_annotations(pod).get(contract_keys.RANK) or labels(pod).get(contract_keys.RANK)
    if not value:
        return None
    try:
        return contract_keys.parse_rank(str(value))
    except ValueError:
        return None


def _explicit_leader(pod: Pod) -> bool:
    return str(pod_annotations(pod).get(contract_keys.LEADER, "")).strip().lower() == "true"


def _scope_of(pod: Pod) -> CheckpointScope | None:
    value = pod_annotations(pod).get(contract_keys.CHECKPOINT_SCOPE)
    if value is None:
        return None
    try:
        return contract_keys.parse_scope(str(value))
    except ValueError:
        return None


def build_gang(
    key: GangKey,
    pods: Iterable[Any],
    *,
    labeler: Labeler | None = None,
    node_labels: Callable[[str], Mapping[str, str]] = lambda _node: {},
    url_policy: UrlPolicy = POD_IP_ONLY,
) -> Gang:
    """All of one gang's pods as a ``Gang``: ranks, exactly one leader or more, scope, labels.

    Leader: the pods the workload or its framework marks; when none is marked, the lowest
    rank (else the first by name), so a ``leader``-scoped gang always has someone to ask.
    Scope: the leader's ``checkpoint-scope``, else any member's, else ``rank``.
    """
    raw = sorted((as_pod(p) for p in pods), key=name_of)
    has_leading = any(_replica_type(p) in LEADING_REPLICA_TYPES for p in raw)
    ranks = [
        r
        if (r := _explicit_rank(p)) is not None
        else framework_rank(p, gang_has_leading_replica=has_leading)
        for p in raw
    ]
    ranks = _jobset_global_ranks(raw, ranks)
    leaders = [_explicit_leader(p) or framework_leader(p) for p in raw]
    if raw and not any(leaders):
        order = sorted(
            range(len(raw)), key=lambda i: (ranks[i] is None, ranks[i] or 0, name_of(raw[i]))
        )
        leaders[order[0]] = True
    members = tuple(
        member_of(p, rank=r, leader=lead, url_policy=url_policy)
        for p, r, lead in zip(raw, ranks, leaders, strict=True)
    )
    members = tuple(sorted(members, key=lambda m: (m.rank is None, m.rank or 0, m.name)))
    leader_pods = [p for p, lead in zip(raw, leaders, strict=True) if lead]
    scope = next(
        (s for p in (*leader_pods, *raw) if (s := _scope_of(p)) is not None), CheckpointScope.RANK
    )
    gang_labels: Mapping[str, str] = {}
    if labeler is not None and raw:
        anchor = leader_pods[0] if leader_pods else raw[0]
        gang_labels = labeler(labels(anchor), node_labels(node_of(anchor)))
    return Gang(key=key, members=members, scope=scope, labels=frozen_map(gang_labels))


def _jobset_global_ranks(pods: Sequence[Pod], ranks: list[int | None]) -> list[int | None]:
    """A JobSet rank spans its child Jobs, so ``job-global-index`` decides it.

    With one pod per child Job (the usual shape) the global index is the rank. With several,
    rank = position in (global index, completion index) order, which is exact only when the
    whole gang is present; it is used only when no pod names its rank explicitly.
    """
    globals_ = [_index(_marker(p, JOBSET_GLOBAL_INDEX)) for p in pods]
    if (
        not pods
        or any(g is None for g in globals_)
        or any(_explicit_rank(p) is not None for p in pods)
    ):
        return ranks
    completions = [_index(_marker(p, COMPLETION_INDEX)) or 0 for p in pods]
    if not any(completions):
        return list(globals_)
    order = sorted(range(len(pods)), key=lambda i: (globals_[i] or 0, completions[i]))
    out = list(ranks)
    for position, i in enumerate(order):
        out[i] = position
    return out
