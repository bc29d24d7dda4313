"""The informer cache: nodes, GPU pods, Kueue Workloads and PDBs, indexed for a notice.

A notice names an instance (``i-0abc``, a GCE instance name or numeric id), a provider ID, a
node, or a Workload; within the notice's window we must find every gang with a rank on the
doomed node, and every other rank of those gangs wherever it runs. Asking the API server
then costs round trips at the worst moment (a storm), so the answers come from memory,
kept current by ``watch.watch_objects`` (one LIST+WATCH per collection).

Only pods that hold GPUs and have not finished are kept, and of each only the fields the
gang logic reads: a cluster's CPU pods and its pods' managed fields would otherwise dwarf
the daemon. A ``Listed`` snapshot replaces a collection's contents, so a pod deleted while
the watch was down does not linger. Updates are applied synchronously on the event loop,
so a query never sees an index half-updated.

Watch failures never stop the daemon: a retriable one is retried inside the watch, anything
else (RBAC, a missing CRD) is logged and the collection is retried after a pause, while
``synced`` stays honest. The Kueue Workload CRD is optional: when it is not installed the
workload index stays empty and does not hold back ``synced``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import sys
import zlib
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from reclaimd import kueueapi, logs
from reclaimd.annotations import UrlPolicy
from reclaimd.backoff import Backoff
from reclaimd.cluster import apiserver, client, gangs, podsnapshot
from reclaimd.cluster.apiserver import ApiServer
from reclaimd.cluster.pdbs import PdbIndex
from reclaimd.cluster.watch import (
    Changed,
    Endpoint,
    KubeEndpoint,
    Listed,
    RawObject,
    watch_objects,
)
from reclaimd.model import Gang, GangKey, Target, WorkloadRef, utcnow
from reclaimd.settings.cache import CacheSettings
from reclaimd.sources import instance_of

log = logging.getLogger(__name__)

PodId = tuple[str, str]  # namespace, name
# The pods that left the cache, by uid, with when: a successor draining a dead owner's gang
# finds its pods gone and charges them to when they went, not to when it looked; and a notice
# whose gang left before it was resolved (Kueue deletes a reclaimed Workload's pods itself)
# still finds the gang. Bounded: a storm's worth.
MAX_GONE = 20_000
# The snapshot keeps the pods that left this recently: a notice older than that is past any
# window plus policy.expired_after_s, and needs none of them.
SNAPSHOT_GONE_FOR = timedelta(minutes=15)
Labeler = gangs.Labeler

# Node metadata that names the cloud instance when the providerID does not (or in another
# form: GKE's numeric instance id is what the preemption log entry carries).
INSTANCE_ID_KEYS = (
    "container.googleapis.com/instance_id",
    "alpha.eksctl.io/instance-id",
    "reclaimd.io/instance-id",
)
# Pod annotations worth keeping: the contract's and the integrations'. Others (notably
# kubectl's last-applied-configuration) can be large and are never read.
KEPT_ANNOTATION_PREFIXES = (
    "reclaimd.io/",
    "kueue.x-k8s.io/",
    "scheduling.k8s.io/",
    "volcano.sh/",
    "jobset.sigs.k8s.io/",
    "leaderworkerset.sigs.k8s.io/",
    "training.kubeflow.org/",
    "batch.kubernetes.io/",
)


PDB_API = "policy/v1"


@dataclass(frozen=True)
class WorkloadApi:
    """Where Kueue Workloads are served. v1beta2 is the storage version since Kueue 0.15."""

    group: str = "kueue.x-k8s.io"
    version: str = "v1beta2"
    plural: str = "workloads"


def instance_ids(node: RawObject) -> frozenset[str]:
    """Every cloud instance id a node answers to.

    The one its providerID names (``sources.instance_of``), plus the node metadata keys in
    ``INSTANCE_ID_KEYS``.
    """
    found: set[str] = set()
    if instance := instance_of(str((node.get("spec") or {}).get("providerID") or "")):
        found.add(instance)
    meta = node.get("metadata") or {}
    for source in (meta.get("labels") or {}, meta.get("annotations") or {}):
        for key in INSTANCE_ID_KEYS:
            if value := source.get(key):
                found.add(str(value))
    return frozenset(found)


def slim_pod(pod: RawObject) -> dict[str, Any]:
    """The fields of a pod the gang logic reads; everything else is dropped."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}

    def gpu_resources(resources: Any) -> dict[str, Any]:
        # Only GPU quantities are ever read; CPU and memory would be a quarter of the pod.
        if not isinstance(resources, Mapping):
            return {}
        return {
            kind: {n: q for n, q in amounts.items() if gangs.is_gpu_resource(str(n))}
            for kind in ("limits", "requests")
            if isinstance(amounts := resources.get(kind), Mapping)
        }

    def containers(key: str) -> list[dict[str, Any]]:
        return [
            {
                "name": c.get("name"),
                "resources": gpu_resources(c.get("resources")),
                **({"restartPolicy": c["restartPolicy"]} if "restartPolicy" in c else {}),
            }
            for c in spec.get(key) or ()
            if isinstance(c, Mapping)
        ]

    return {
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
            "labels": dict(meta.get("labels") or {}),
            "annotations": {
                k: v
                for k, v in (meta.get("annotations") or {}).items()
                if k.startswith(KEPT_ANNOTATION_PREFIXES)
            },
            "ownerReferences": list(meta.get("ownerReferences") or ()),
            **(
                {"deletionTimestamp": meta["deletionTimestamp"]}
                if meta.get("deletionTimestamp")
                else {}
            ),
        },
        "spec": {
            "nodeName": spec.get("nodeName"),
            "containers": containers("containers"),
            "initContainers": containers("initContainers"),
        },
        "status": {
            **{k: status[k] for k in ("phase", "podIP", "startTime") if k in status},
            # when the pod became Ready: a restarted gang is training again (``restarts``)
            **({"readyAt": ready} if (ready := gangs.ready_since(status)) else {}),
        },
    }


# The claim annotation (``claims.CLAIM_ANNOTATION``; claims imports this module, so the
# name is repeated here rather than imported).
CLAIM_ANNOTATION = "reclaimd.io/claim"
_TAINT_FIELDS = ("key", "value", "effect", "timeAdded")

Taint = dict[str, Any]


@dataclass(frozen=True, slots=True)
class NodeView:
    """What the storm fast path needs to write claim + taint + cordon in one PATCH with a
    resourceVersion precondition, without a GET first."""

    name: str
    resource_version: str
    unschedulable: bool
    taints: tuple[Taint, ...]
    """In API form (camelCase keys, string values, absent fields left out)."""
    claim_text: str | None
    """The raw ``reclaimd.io/claim`` annotation; None when the node carries none."""
    labels: Mapping[str, str]


def node_taints(spec: Mapping[str, Any]) -> tuple[Taint, ...]:
    """A node's taints in API form: only the four fields a taint has, as strings."""
    return tuple(
        {k: str(t[k]) for k in _TAINT_FIELDS if t.get(k) is not None}
        for t in spec.get("taints") or ()
        if isinstance(t, Mapping)
    )


@dataclass(frozen=True, slots=True)
class _Node:
    name: str
    provider_id: str
    instance_ids: tuple[str, ...]
    label_pairs: tuple[str, ...]
    """key, value, key, value...: a third of a dict's size; ``labels`` rebuilds the dict."""
    resource_version: str
    unschedulable: bool
    taints: tuple[Taint, ...]
    claim_text: str | None

    @property
    def labels(self) -> dict[str, str]:
        pairs = self.label_pairs
        return dict(zip(pairs[::2], pairs[1::2], strict=True))


def _interned_pairs(values: Mapping[str, Any]) -> tuple[str, ...]:
    # Label keys and most values repeat across thousands of nodes: share one copy of each.
    return tuple(sys.intern(str(x)) for k, v in values.items() for x in (k, v))


def node_record(obj: RawObject) -> _Node | None:
    """What the cache keeps of a node (None for a node without a name)."""
    meta = obj.get("metadata") or {}
    name = str(meta.get("name") or "")
    if not name:
        return None
    spec = obj.get("spec") or {}
    claim = (meta.get("annotations") or {}).get(CLAIM_ANNOTATION)
    return _Node(
        name=sys.intern(name),
        provider_id=str(spec.get("providerID") or ""),
        instance_ids=tuple(sorted(instance_ids(obj))),
        label_pairs=_interned_pairs(meta.get("labels") or {}),
        resource_version=str(meta.get("resourceVersion") or ""),
        unschedulable=bool(spec.get("unschedulable")),
        taints=node_taints(spec),
        claim_text=None if claim is None else str(claim),
    )


@dataclass(frozen=True, slots=True)
class _Pod:
    """A cached GPU pod: its index keys, and the slim pod as compressed compact JSON.

    That is several times smaller than the same pod as dicts, and is decoded only when a
    notice needs the pod's gang (a few pods per notice, tens of microseconds each).
    """

    pid: PodId
    uid: str
    node: str
    gang: GangKey
    workload_names: tuple[str, ...]
    owner_uids: tuple[str, ...]
    blob: bytes

    def decode(self) -> dict[str, Any]:
        pod: dict[str, Any] = json.loads(zlib.decompress(self.blob))
        return pod


def pod_record(obj: RawObject) -> _Pod | None:
    """What the cache keeps of a pod: None unless it holds GPUs and has not finished."""
    name = gangs.name_of(obj)
    if not name or not gangs.is_gang_member(obj):
        return None
    pod = slim_pod(obj)
    return _Pod(
        pid=(sys.intern(gangs.namespace_of(obj)), name),
        uid=gangs.uid_of(pod),
        node=sys.intern(gangs.node_of(pod)),
        gang=gangs.gang_key(pod),
        workload_names=tuple(gangs.workload_names(pod)),
        owner_uids=tuple(gangs.owner_uids(pod)),
        blob=zlib.compress(json.dumps(pod, separators=(",", ":")).encode(), 1),
    )


@dataclass(frozen=True)
class _Workload:
    uid: str
    job_uids: frozenset[str]


class _Indexes:
    """Every index, updated together; no awaits inside, so readers see whole updates.

    ``replace_*`` take raw objects or the records an endpoint's projection already made."""

    def __init__(self) -> None:
        self.nodes: dict[str, _Node] = {}
        self.by_provider: dict[str, str] = {}
        self.by_instance: dict[str, str] = {}
        self.pods: dict[PodId, _Pod] = {}
        self.by_node: defaultdict[str, set[PodId]] = defaultdict(set)
        self.by_gang: defaultdict[GangKey, set[PodId]] = defaultdict(set)
        self.by_workload_name: defaultdict[tuple[str, str], set[PodId]] = defaultdict(set)
        self.by_owner_uid: defaultdict[tuple[str, str], set[PodId]] = defaultdict(set)
        self.workloads: dict[tuple[str, str], _Workload] = {}
        # pod uid -> when it left, and what it was (oldest first)
        self.gone: dict[str, tuple[datetime, _Pod]] = {}
        self.changes = 0  # pods added or dropped: the snapshot is written when it moved

    # nodes

    def replace_nodes(self, objects: Iterable[RawObject | _Node]) -> None:
        self.nodes.clear()
        self.by_provider.clear()
        self.by_instance.clear()
        for obj in objects:
            node = obj if isinstance(obj, _Node) else node_record(obj)
            if node is not None:
                self._add_node(node)

    def put_node(self, obj: RawObject) -> None:
        node = node_record(obj)
        if node is not None:
            self.drop_node(node.name)
            self._add_node(node)

    def _add_node(self, node: _Node) -> None:
        self.nodes[node.name] = node
        if node.provider_id:
            self.by_provider[node.provider_id] = node.name
        for iid in node.instance_ids:
            self.by_instance[iid] = node.name

    def drop_node(self, name: str) -> None:
        old = self.nodes.pop(name, None)
        if old is None:
            return
        if self.by_provider.get(old.provider_id) == name:
            del self.by_provider[old.provider_id]
        for iid in old.instance_ids:
            if self.by_instance.get(iid) == name:
                del self.by_instance[iid]

    # pods

    def replace_pods(self, namespace: str, objects: Iterable[RawObject | _Pod]) -> None:
        for pid in [p for p in self.pods if not namespace or p[0] == namespace]:
            self.drop_pod(pid)
        for obj in objects:
            pod = obj if isinstance(obj, _Pod) else pod_record(obj)
            if pod is not None:
                self.drop_pod(pod.pid)
                self._add_pod(pod)

    def put_pod(self, obj: RawObject) -> None:
        # Dropped first: a pod that finished or lost its GPUs leaves the cache.
        self.drop_pod((gangs.namespace_of(obj), gangs.name_of(obj)))
        pod = pod_record(obj)
        if pod is not None:
            self._add_pod(pod)

    def _add_pod(self, pod: _Pod) -> None:
        pid = pod.pid
        self.changes += 1
        self.gone.pop(pod.uid, None)  # back (a relist drops and re-adds every pod)
        self.pods[pid] = pod
        self.by_gang[pod.gang].add(pid)
        if pod.node:
            self.by_node[pod.node].add(pid)
        for name in pod.workload_names:
            self.by_workload_name[(pid[0], name)].add(pid)
        for uid in pod.owner_uids:
            self.by_owner_uid[(pid[0], uid)].add(pid)

    def drop_pod(self, pid: PodId) -> None:
        pod = self.pods.pop(pid, None)
        if pod is None:
            return
        self.changes += 1
        self.mark_gone(pod, utcnow())  # deleted, finished, no GPUs: stopped, as far as we know
        _discard(self.by_gang, pod.gang, pid)
        _discard(self.by_node, pod.node, pid)
        for name in pod.workload_names:
            _discard(self.by_workload_name, (pid[0], name), pid)
        for uid in pod.owner_uids:
            _discard(self.by_owner_uid, (pid[0], uid), pid)

    def mark_gone(self, pod: _Pod, at: datetime) -> None:
        if not pod.uid:
            return
        self.gone.pop(pod.uid, None)  # to the end: the dict stays in the order they left
        self.gone[pod.uid] = (at, pod)
        if len(self.gone) > MAX_GONE:
            del self.gone[next(iter(self.gone))]

    def snapshot_rows(self, since: datetime) -> list[podsnapshot.Row]:
        """The pods held, and those that left after ``since``: what a successor may need."""
        rows: list[podsnapshot.Row] = [(at, p.blob) for at, p in self.gone.values() if at >= since]
        rows += [(None, p.blob) for p in self.pods.values()]
        return rows

    # workloads

    def replace_workloads(self, namespace: str, objects: Iterable[RawObject]) -> None:
        for wid in [w for w in self.workloads if not namespace or w[0] == namespace]:
            del self.workloads[wid]
        for obj in objects:
            self.put_workload(obj)

    def put_workload(self, obj: RawObject) -> None:
        meta = obj.get("metadata") or {}
        wid = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        job_uids = {str((meta.get("labels") or {}).get(gangs.KUEUE_JOB_UID) or "")}
        job_uids |= {
            str(ref.get("uid") or "")
            for ref in meta.get("ownerReferences") or ()
            if isinstance(ref, Mapping) and ref.get("controller")
        }
        self.workloads[wid] = _Workload(
            str(meta.get("uid") or ""), frozenset(u for u in job_uids if u)
        )

    def drop_workload(self, obj: RawObject) -> None:
        meta = obj.get("metadata") or {}
        self.workloads.pop((str(meta.get("namespace") or ""), str(meta.get("name") or "")), None)


class TakingTurns:
    """An endpoint whose LISTs take turns with the other collections' (one ``turn`` lock).

    A LIST page is parsed whole before it is projected: pages of nodes and pods parsed at the
    same moment would add up to the process's peak. Watches do not wait.
    """

    def __init__(self, endpoint: Endpoint, turn: asyncio.Lock) -> None:
        self._endpoint = endpoint
        self._turn = turn

    async def list(self) -> tuple[list[Any], str]:
        async with self._turn:
            return await self._endpoint.list()

    def watch(
        self, resource_version: str, timeout_s: int
    ) -> AbstractAsyncContextManager[AsyncIterator[RawObject]]:
        return self._endpoint.watch(resource_version, timeout_s)


def _log_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (error := task.exception()) is not None:
        log.error("cache watch %s stopped: %r", task.get_name(), error)


def _discard(index: defaultdict[Any, set[PodId]], key: Any, pid: PodId) -> None:
    members = index.get(key)
    if members is not None:
        members.discard(pid)
        if not members:
            del index[key]


class _StreamState:
    """How one collection's watch is doing (``watch.Progress``)."""

    def __init__(self) -> None:
        self.broken = ""  # why it is not current, while it backs off
        self.progress_at = asyncio.get_running_loop().time()

    def progressed(self) -> None:
        self.broken = ""
        self.progress_at = asyncio.get_running_loop().time()

    def failed(self, reason: str) -> None:
        self.broken = reason[:200] or "failed"


@dataclass(frozen=True)
class _Stream:
    name: str
    endpoint: Endpoint
    apply: Callable[[Listed | Changed], None]
    optional: bool


class ClusterCache:
    """LIST+WATCH of nodes, pods and Workloads, and the queries a notice needs.

    ``start`` lists and watches every collection in tasks of its own; ``run`` (a long-lived
    task the daemon supervises) keeps them alive: a watch task that died, or one stuck with no
    progress for ``stall_after_s``, is restarted. ``current`` is what ``/readyz`` shows: every
    collection listed, every watch running and not backing off from a failure.
    """

    def __init__(
        self,
        api_client: ApiServer,
        *,
        settings: CacheSettings = CacheSettings(),
        labeler: Labeler | None = None,
        url_policy: UrlPolicy = UrlPolicy(),
        workloads: WorkloadApi = WorkloadApi(),
    ) -> None:
        self._api = api_client
        self._settings = settings
        # Not settings: where checkpoint URLs may point is derived from the checkpoint
        # section; the Workload API's version is the one the cluster serves (looked up).
        self._url_policy = url_policy
        self._workload_api = workloads
        self._labeler = labeler
        self._idx = _Indexes()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._streams: dict[str, _Stream] = {}
        self._states: dict[str, _StreamState] = {}
        self.restarts = 0  # watch tasks the supervisor restarted
        self._pending: set[str] = set()
        self._synced_event = asyncio.Event()
        self._listing = asyncio.Lock()
        self.workloads_available = False
        self._pdbs = PdbIndex()
        self._written = 0  # ``_idx.changes`` as of the last snapshot written

    # --- lifecycle -----------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        return self._synced_event.is_set()

    async def start(self) -> None:
        if self._tasks:
            return
        api = self._api
        page = self._settings.watch.page_size
        streams: list[tuple[str, Endpoint, Callable[[Listed | Changed], None], bool]] = [
            (
                "nodes",
                KubeEndpoint(api, apiserver.node(), "nodes", page_size=page, project=node_record),
                self._on_node,
                False,
            )
        ]
        # The Workload version the cluster serves (one discovery, shared by the process).
        wl = self._workload_api
        wl = replace(wl, version=await kueueapi.version_or(self._api, wl.version))
        for ns in self._settings.namespaces or ("",):
            # ns "": every namespace's collection (``/api/v1/pods``), named "pods".
            where = f" in {ns}" if ns else ""
            pods = KubeEndpoint(
                api, apiserver.pod(ns), f"pods{where}", page_size=page, project=pod_record
            )
            workloads = KubeEndpoint(
                api,
                apiserver.group(f"{wl.group}/{wl.version}", wl.plural, namespace=ns),
                f"workloads{where}",
                page_size=page,
            )
            streams.append((f"pods/{ns}", pods, self._pod_applier(ns), False))
            if self._settings.watch_pdbs:
                pdbs = KubeEndpoint(
                    api,
                    apiserver.group(PDB_API, "poddisruptionbudgets", namespace=ns),
                    f"poddisruptionbudgets{where}",
                    page_size=page,
                )
                streams.append((f"pdbs/{ns}", pdbs, self._pdb_applier(ns), False))
            if self._settings.watch_workloads:
                streams.append((f"workloads/{ns}", workloads, self._workload_applier(ns), True))
        self._restore()
        self._begin([_Stream(n, TakingTurns(e, self._listing), a, o) for n, e, a, o in streams])

    def _restore(self) -> None:
        """The last process's pods, from this disk, as gone now: the first LIST brings back
        those still there, and the rest left while no process here watched."""
        path = self._settings.snapshot_path
        if path is None:
            return
        now, restored = utcnow(), 0
        for gone, blob in podsnapshot.read(path):
            try:
                pod = pod_record(json.loads(zlib.decompress(blob)))
            except (zlib.error, ValueError):
                pod = None
            if pod is not None and pod.uid:
                self._idx.mark_gone(pod, gone or now)
                restored += 1
        self._written = self._idx.changes
        if restored:
            logs.event(log, "pod snapshot restored", path=str(path), pods=restored)

    async def _save(self) -> None:
        """Write the snapshot if the pods changed since the last write; never raises."""
        path = self._settings.snapshot_path
        if path is None or self._idx.changes == self._written or not self.synced:
            return
        changes = self._idx.changes
        rows = self._idx.snapshot_rows(utcnow() - SNAPSHOT_GONE_FOR)
        try:
            await asyncio.to_thread(podsnapshot.write, path, rows)
            self._written = changes
        except OSError as e:
            logs.event(log, "pod snapshot not written", logging.WARNING, error=str(e)[:200])

    def _begin(self, streams: Iterable[_Stream]) -> None:
        for stream in streams:
            self._streams[stream.name] = stream
            self._pending.add(stream.name)
        for name in self._streams:
            self._launch(name)

    def _launch(self, name: str) -> None:
        stream = self._streams[name]
        self._states[name] = _StreamState()
        task = asyncio.create_task(self._run(stream), name=f"cache-{name}")
        task.add_done_callback(_log_crash)
        self._tasks[name] = task

    async def run(self) -> None:
        """Supervise the watches until cancelled (``start`` first)."""
        every = self._settings.supervise_interval_s
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(every)
            await self._save()
            for name, task in list(self._tasks.items()):
                silent = loop.time() - self._states[name].progress_at
                if task.done():
                    why = "its task ended"
                elif silent > self._settings.stall_after_s:
                    why = f"no progress for {silent:.0f} s"
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
                else:
                    continue
                logs.event(log, "cache watch restarted", logging.WARNING, stream=name, why=why)
                self.restarts += 1
                self._launch(name)

    @property
    def current(self) -> bool:
        """Listed, and every watch running and not broken: what the cache holds is the
        cluster as of a moment ago. False while a watch backs off (API server unreachable)."""
        return (
            self.synced
            and bool(self._tasks)
            and not any(t.done() for t in self._tasks.values())
            and not any(s.broken for s in self._states.values())
        )

    def why_not_current(self) -> str:
        if not self.synced:
            return "not listed yet"
        for name, task in self._tasks.items():
            if task.done():
                return f"{name}: watch task ended"
            if self._states[name].broken:
                return f"{name}: {self._states[name].broken}"
        return ""

    async def wait_synced(self, timeout_s: float) -> bool:
        """True once every collection has been listed; False if ``timeout_s`` passes first."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._synced_event.wait()
        except TimeoutError:
            return False
        return True

    async def stop(self) -> None:
        tasks, self._tasks = list(self._tasks.values()), {}
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._save()

    async def _run(self, stream: _Stream) -> None:
        name, endpoint, apply, optional = (
            stream.name,
            stream.endpoint,
            stream.apply,
            stream.optional,
        )
        state = self._states[name]
        # After a failure the watch cannot retry itself (RBAC, a CRD missing, a 403 from an
        # API server whose authorizer is still syncing after a restart): soon at first, then
        # up to the pause, so a fixed RBAC or a new CRD is picked up without a restart.
        pause = Backoff(
            min(1.0, self._settings.permanent_error_pause_s), self._settings.permanent_error_pause_s
        )
        while True:
            try:
                async for event in watch_objects(
                    endpoint, settings=self._settings.watch, name=name, progress=state
                ):
                    pause.reset()
                    apply(event)
                    if isinstance(event, Listed):
                        self._listed(name)
            except client.NotFound as e:
                if not optional:
                    log.error("cache %s: %s", name, e)
                else:
                    # No Workload CRD in this cluster: nothing to index, nothing to wait for.
                    self.workloads_available = False
                    log.info("cache %s: resource not served, retrying later", name)
                    state.progressed()  # nothing to hold is current too
                    self._listed(name)
            except client.KubeError as e:
                log.error("cache %s: %s; retrying within %.0fs", name, e, pause.ceiling())
            await pause.sleep()

    def _listed(self, name: str) -> None:
        self._pending.discard(name)
        if not self._pending:
            self._synced_event.set()

    # --- appliers ------------------------------------------------------------------------

    def _on_node(self, event: Listed | Changed) -> None:
        if isinstance(event, Listed):
            self._idx.replace_nodes(event.objects)
        elif event.type == "DELETED":
            self._idx.drop_node(str((event.object.get("metadata") or {}).get("name") or ""))
        else:
            self._idx.put_node(event.object)

    def _pod_applier(self, namespace: str) -> Callable[[Listed | Changed], None]:
        def apply(event: Listed | Changed) -> None:
            if isinstance(event, Listed):
                self._idx.replace_pods(namespace, event.objects)
            elif event.type == "DELETED":
                self._idx.drop_pod((gangs.namespace_of(event.object), gangs.name_of(event.object)))
            else:
                self._idx.put_pod(event.object)

        return apply

    def _pdb_applier(self, namespace: str) -> Callable[[Listed | Changed], None]:
        def apply(event: Listed | Changed) -> None:
            if isinstance(event, Listed):
                self._pdbs.replace(namespace, event.objects)
            elif event.type == "DELETED":
                self._pdbs.drop(event.object)
            else:
                self._pdbs.put(event.object)

        return apply

    def _workload_applier(self, namespace: str) -> Callable[[Listed | Changed], None]:
        def apply(event: Listed | Changed) -> None:
            if isinstance(event, Listed):
                self.workloads_available = True
                self._idx.replace_workloads(namespace, event.objects)
            elif event.type == "DELETED":
                self._idx.drop_workload(event.object)
            else:
                self._idx.put_workload(event.object)

        return apply

    # --- queries -------------------------------------------------------------------------

    def resolve_node(self, target: Target) -> str | None:
        """The node a target names, by node name, provider ID or instance id; None if unknown."""
        idx = self._idx
        if target.node_name and target.node_name in idx.nodes:
            return target.node_name
        if target.provider_id and (name := idx.by_provider.get(target.provider_id)):
            return name
        if target.instance_id and (name := idx.by_instance.get(target.instance_id)):
            return name
        return None

    def sizes(self) -> dict[str, int]:
        """How many nodes and GPU pods are cached (benches and diagnostics)."""
        return {"nodes": len(self._idx.nodes), "pods": len(self._idx.pods)}

    def node(self, name: str) -> NodeView | None:
        """The cached node as of its last watch event; None if the cache does not know it."""
        node = self._idx.nodes.get(name)
        if node is None:
            return None
        return NodeView(
            name=node.name,
            resource_version=node.resource_version,
            unschedulable=node.unschedulable,
            # Copies: a caller building its PATCH from these must not edit the cache.
            taints=tuple(dict(t) for t in node.taints),
            claim_text=node.claim_text,
            labels=node.labels,
        )

    def node_claims(self) -> list[tuple[str, str]]:
        """(node, raw claim annotation) for every cached node that carries a claim: what the
        resume scan reads instead of listing every node."""
        return [(n.name, n.claim_text) for n in self._idx.nodes.values() if n.claim_text]

    def provider_id(self, name: str) -> str:
        """The node's ``spec.providerID`` ("" when unknown): where its instance id is."""
        node = self._idx.nodes.get(name)
        return node.provider_id if node is not None else ""

    def gpu_pods(self) -> list[dict[str, Any]]:
        """Every cached GPU pod in its slim form (decoded: a list the caller may keep)."""
        return [pod.decode() for pod in self._idx.pods.values()]

    def node_labels(self, name: str) -> Mapping[str, str]:
        node = self._idx.nodes.get(name)
        return node.labels if node is not None else {}

    def pod_gone_at(self, uid: str) -> datetime | None:
        """When the pod with ``uid`` was seen to leave (None: never seen to, or too long ago)."""
        gone = self._idx.gone.get(uid) if uid else None
        return gone[0] if gone is not None else None

    def pod_exists(self, namespace: str, name: str, uid: str = "") -> bool:
        """Whether the GPU pod is still there (and is the same pod, when ``uid`` is given)."""
        pod = self._idx.pods.get((namespace, name))
        return pod is not None and (not uid or pod.uid == uid)

    @contextlib.contextmanager
    def budget_changes(self, namespace: str, name: str) -> Iterator[asyncio.Event | None]:
        """An event set when a PodDisruptionBudget covering the pod changes (``pdbs``); None
        while the PDB watch is not current (a change could be missed: retry on a timer)."""
        if not self._pdbs_current():
            yield None
            return
        pod = self._idx.pods.get((namespace, name))
        labels = (pod.decode().get("metadata") or {}).get("labels") or {} if pod else {}
        with self._pdbs.watching(namespace, labels) as event:
            yield event

    def _pdbs_current(self) -> bool:
        """The PDB watch is synced and unbroken: no PDB it reports can be missing."""
        states = [s for n, s in self._states.items() if n.startswith("pdbs/")]
        return bool(states) and not any(s.broken for s in states) and self.synced

    def pdbs_guard_only_its_gang(self, namespace: str, name: str) -> bool:
        """Every PDB covering the pod pins its gang's identity labels, so none protects a pod
        of anything else; false while the PDB watch is not current (one may be unknown)."""
        pod = self._idx.pods.get((namespace, name))
        if pod is None or not self._pdbs_current():
            return False
        raw = pod.decode()
        labels = (raw.get("metadata") or {}).get("labels") or {}
        return self._pdbs.guards_only(namespace, labels, gangs.identity_labels(raw))

    def gang(self, key: GangKey) -> Gang | None:
        pids = self._idx.by_gang.get(key)
        return self._build(key, pids) if pids else None

    def gangs_on_nodes(
        self, nodes: Iterable[str], *, since: datetime | None = None
    ) -> tuple[Gang, ...]:
        """Every gang with a rank on one of ``nodes``, with all of its ranks, wherever they run;
        with ``since``, also the ranks that left those nodes since then (a notice's gang is
        still its to charge when its pods went before the notice was resolved)."""
        nodes = set(nodes)
        idx = self._idx
        keys = {idx.pods[pid].gang for node in nodes for pid in idx.by_node.get(node, ())}
        keys |= {p.gang for p in self._gone_since(since) if p.node in nodes}
        return self._gangs(keys, since)

    def gangs_of_workload(
        self, ref: WorkloadRef, *, since: datetime | None = None
    ) -> tuple[Gang, ...]:
        """The gangs of a Kueue Workload's pods.

        Pods name their Workload (pod groups, TAS annotation), or are found through the job
        the Workload belongs to: its ``kueue.x-k8s.io/job-uid`` label or controlling owner,
        matched against each pod's controller uid, Job controller-uid or JobSet uid. With
        ``since``, also the pods that left since then: Kueue deletes a reclaimed Workload's
        pods itself, often before the notice is resolved.
        """
        idx = self._idx
        pids = set(idx.by_workload_name.get((ref.namespace, ref.name), ()))
        owners = {ref.uid} if ref.uid else set()  # a ref may name the job object itself
        workload = idx.workloads.get((ref.namespace, ref.name))
        # A different uid is a Workload recreated under the same name: its jobs are not ours.
        if workload is not None and (not ref.uid or ref.uid == workload.uid):
            owners |= set(workload.job_uids)
        for uid in owners:
            pids |= idx.by_owner_uid.get((ref.namespace, uid), set())
        keys = {idx.pods[pid].gang for pid in pids}
        keys |= {
            p.gang
            for p in self._gone_since(since)
            if p.pid[0] == ref.namespace
            and (ref.name in p.workload_names or owners.intersection(p.owner_uids))
        }
        return self._gangs(keys, since)

    def _gone_since(self, since: datetime | None) -> Iterator[_Pod]:
        if since is None:
            return
        for at, pod in reversed(self._idx.gone.values()):  # newest first: stop at the first older
            if at < since:
                return
            yield pod

    def _gangs(self, keys: Iterable[GangKey], since: datetime | None = None) -> tuple[Gang, ...]:
        gone: dict[GangKey, list[_Pod]] = {}
        for pod in self._gone_since(since):
            if pod.gang in keys and pod.pid not in self._idx.pods:
                gone.setdefault(pod.gang, []).append(pod)
        return tuple(
            self._build(key, self._idx.by_gang.get(key, ()), gone.get(key, ()))
            for key in sorted(keys, key=str)
        )

    def _build(self, key: GangKey, pids: Iterable[PodId], gone: Iterable[_Pod] = ()) -> Gang:
        gone = tuple(gone)
        gang = gangs.build_gang(
            key,
            [self._idx.pods[pid].decode() for pid in pids] + [p.decode() for p in gone],
            labeler=self._labeler,
            node_labels=self.node_labels,
            url_policy=self._url_policy,
        )
        if not gone:
            return gang
        # A rank that left is charged, never asked: its address may be another pod's by now,
        # and whatever answers there did not save this rank.
        left = {p.uid for p in gone}
        members = tuple(
            dataclasses.replace(m, checkpoint_url="") if m.uid in left else m for m in gang.members
        )
        return dataclasses.replace(gang, members=members)
