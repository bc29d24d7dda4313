"""The cluster cache's queries: a read-only view of its indexes, for the notice's side.

What the intake, the runbook, the claim log, the meter and the restart watcher ask of the
cluster (which node a target names, a node's claim and taints, the gangs on a node or of a
Workload, whether a pod is still there or when it left, the PDBs covering it) is answered
here from memory. ``CacheView`` never changes an index: ``ClusterCache`` applies the watches'
events and hands out its ``view``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime
from typing import Any

from reclaimd.annotations import UrlPolicy
from reclaimd.cluster import gangs
from reclaimd.cluster.indexes import Indexes, NodeView, PodId, PodRecord
from reclaimd.cluster.pdbs import PdbIndex
from reclaimd.model import Gang, GangKey, Target, WorkloadRef


class CacheView:
    """The queries a notice needs, over the cache's indexes and PDBs (read, never written).

    ``pdbs_current``: whether the PDB watch is synced and unbroken (the cache's supervision
    knows; a PDB it reports cannot be missing then).
    """

    def __init__(
        self,
        indexes: Indexes,
        pdbs: PdbIndex,
        *,
        pdbs_current: Callable[[], bool],
        labeler: gangs.Labeler | None,
        url_policy: UrlPolicy,
    ) -> None:
        self._idx = indexes
        self._pdbs = pdbs
        self._pdbs_current = pdbs_current
        self._labeler = labeler
        self._url_policy = url_policy

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

    def _gone_since(self, since: datetime | None) -> Iterator[PodRecord]:
        if since is None:
            return
        for at, pod in reversed(self._idx.gone.values()):  # newest first: stop at the first older
            if at < since:
                return
            yield pod

    def _gangs(self, keys: Iterable[GangKey], since: datetime | None = None) -> tuple[Gang, ...]:
        gone: dict[GangKey, list[PodRecord]] = {}
        for pod in self._gone_since(since):
            if pod.gang in keys and pod.pid not in self._idx.pods:
                gone.setdefault(pod.gang, []).append(pod)
        return tuple(
            self._build(key, self._idx.by_gang.get(key, ()), gone.get(key, ()))
            for key in sorted(keys, key=str)
        )

    def _build(self, key: GangKey, pids: Iterable[PodId], gone: Iterable[PodRecord] = ()) -> Gang:
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
