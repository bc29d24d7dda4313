"""The informer cache: LIST+WATCH of nodes, GPU pods, Kueue Workloads and PDBs, supervised.

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

This module holds the watches and their supervision; what is kept and indexed is in
``indexes``, the queries a notice asks in ``cacheview`` (``ClusterCache.view``), the pods kept
on the replica's disk in ``podsnapshot``.

Watch failures never stop the daemon: a retriable one is retried inside the watch, anything
else (RBAC, a missing CRD) is logged and the collection is retried after a pause, while
``synced`` stays honest. The Kueue Workload CRD is optional: when it is not installed the
workload index stays empty and does not hold back ``synced``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, replace
from typing import Any

from reclaimd import kueueapi, logs
from reclaimd.annotations import UrlPolicy
from reclaimd.backoff import Backoff
from reclaimd.cluster import apiserver, errors, gangs
from reclaimd.cluster.apiserver import ApiServer
from reclaimd.cluster.cacheview import CacheView
from reclaimd.cluster.indexes import Indexes, node_record, pod_record
from reclaimd.cluster.pdbs import PdbIndex
from reclaimd.cluster.podsnapshot import PodSnapshot
from reclaimd.cluster.watch import (
    Changed,
    Endpoint,
    KubeEndpoint,
    Listed,
    RawObject,
    watch_objects,
)
from reclaimd.settings.cache import CacheSettings

log = logging.getLogger(__name__)

Labeler = gangs.Labeler

PDB_API = "policy/v1"


@dataclass(frozen=True)
class WorkloadApi:
    """Where Kueue Workloads are served. v1beta2 is the storage version since Kueue 0.15."""

    group: str = "kueue.x-k8s.io"
    version: str = "v1beta2"
    plural: str = "workloads"


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
    """LIST+WATCH of nodes, pods and Workloads, supervised; ``view`` answers a notice's queries.

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
        self._workload_api = workloads
        self._idx = Indexes()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._streams: dict[str, _Stream] = {}
        self._states: dict[str, _StreamState] = {}
        self.restarts = 0  # watch tasks the supervisor restarted
        self._pending: set[str] = set()
        self._synced_event = asyncio.Event()
        self._listing = asyncio.Lock()
        self.workloads_available = False
        self._pdbs = PdbIndex()
        self._snapshot = PodSnapshot(settings.snapshot_path, self._idx)
        self.view = CacheView(
            self._idx,
            self._pdbs,
            pdbs_current=self._pdbs_current,
            labeler=labeler,
            url_policy=url_policy,
        )

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
        self._snapshot.restore()
        self._begin([_Stream(n, TakingTurns(e, self._listing), a, o) for n, e, a, o in streams])

    async def _save(self) -> None:
        if self.synced:  # before, the indexes hold only part of the cluster
            await self._snapshot.save()

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
            except errors.NotFound as e:
                if not optional:
                    log.error("cache %s: %s", name, e)
                else:
                    # No Workload CRD in this cluster: nothing to index, nothing to wait for.
                    self.workloads_available = False
                    log.info("cache %s: resource not served, retrying later", name)
                    state.progressed()  # nothing to hold is current too
                    self._listed(name)
            except errors.KubeError as e:
                log.error("cache %s: %s; retrying within %.0fs", name, e, pause.ceiling())
            await pause.sleep()

    def _pdbs_current(self) -> bool:
        """The PDB watch is synced and unbroken: no PDB it reports can be missing."""
        states = [s for n, s in self._states.items() if n.startswith("pdbs/")]
        return bool(states) and not any(s.broken for s in states) and self.synced

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

    def sizes(self) -> dict[str, int]:
        """How many nodes and GPU pods are cached (benches and diagnostics)."""
        return {"nodes": len(self._idx.nodes), "pods": len(self._idx.pods)}
