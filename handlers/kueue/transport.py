"""Kueue transport: a watch on ``workloads.kueue.x-k8s.io``, every version to the kueue parser.

Kueue says nothing ahead of a preemption: its scheduler sets ``Evicted``/``Preempted`` on the
victim's Workload and the job is suspended in the same breath. So the signal is the Workload
itself, read through the shared LIST+WATCH (``reclaimd.cluster.watch``: resourceVersions,
bookmarks, relist on 410). Every object a LIST or an ADDED/MODIFIED event carries is handed to
``handlers.parse("kueue", ...)``, which decides whether it is a reclaim notice; ``DELETED``
only drops what we remember of the object.

- Version: v1beta2 (Kueue's storage version since 0.15) when the cluster serves it, else
  v1beta1, found by the one discovery every part shares (``reclaimd.kueueapi``); no Kueue
  API at all is waited for, not fatal.
- Dedupe: the intake's (stable notice ids). Here only the cheap part: an object version seen
  before (a relist repeats them all) is not parsed again, and a notice this workload already
  had admitted is not admitted again when Kueue's follow-up writes (``Requeued``,
  ``QuotaReserved=False``) repeat it.
- A watch delivers an object once, so a notice whose claim could not be stored (admission
  ``RETRY``) is admitted again after a short pause, until it holds or a newer version of the
  same Workload replaces it; the window is the Kueue grace, seconds, not minutes.
- Workloads are handled concurrently (bounded), one at a time per Workload and newest version
  first: a preemption of ten workloads at once must not queue behind one slow claim.
- A restart relists: a Workload evicted while reclaimd was down is admitted then, and its
  claim (on the Workload) answers duplicate if a peer already acted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

from reclaimd import kueueapi, logs
from reclaimd.backoff import Backoff
from reclaimd.cluster import apiserver, errors
from reclaimd.cluster.apiserver import ApiServer
from reclaimd.cluster.watch import (
    Changed,
    KubeEndpoint,
    Listed,
    RawObject,
    WatchEvent,
    watch_objects,
)
from reclaimd.handlers.base import Parser
from reclaimd.handlers.entry import Entry
from reclaimd.handlers.kueue.parser import parse
from reclaimd.handlers.kueue.settings import KueueSettings
from reclaimd.handlers.transport import Admit, Counters, Read, Supplies, admit_all, deliver
from reclaimd.intake import Admission
from reclaimd.kueueapi import GROUP, PLURAL, PREFERRED_VERSIONS, pick_version
from reclaimd.model import Notice, Windows
from reclaimd.settings.watch import WatchSettings

log = logging.getLogger(__name__)

RETRY_PAUSE_S = 1.0  # a notice whose claim failed is admitted again this soon
REWATCH_PAUSE_S = 5.0  # after a watch failure a retry cannot fix (RBAC, no Kueue API yet)
_DEFAULT_WATCH = WatchSettings()
__all__ = ["GROUP", "PLURAL", "PREFERRED_VERSIONS", "KueueSource", "pick_version"]


def object_key(obj: RawObject) -> tuple[str, str, str]:
    """``(namespace, name, uid)``: the uid tells a Workload recreated under the same name."""
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    return (
        str(meta.get("namespace") or ""),
        str(meta.get("name") or ""),
        str(meta.get("uid") or ""),
    )


def resource_version(obj: RawObject) -> str:
    meta = obj.get("metadata")
    return str(meta.get("resourceVersion") or "") if isinstance(meta, Mapping) else ""


Key = tuple[str, str, str]


@dataclass
class _Seen:
    """What one Workload last settled to: its version, and the notices admitted for it."""

    version: str = ""
    notice_ids: frozenset[str] = frozenset()


class KueueSource:
    """Watches Workloads in ``settings.namespaces`` (all when empty) and admits reclaim notices."""

    def __init__(
        self,
        settings: KueueSettings,
        *,
        admit: Admit,
        windows: Windows,
        api: ApiServer,
        watch: WatchSettings = _DEFAULT_WATCH,
        concurrency: int = 8,
        retry_pause_s: float = RETRY_PAUSE_S,
        rewatch_pause_s: float = REWATCH_PAUSE_S,
        versions: kueueapi.WorkloadVersion | None = None,
        parser: Parser = parse,
    ) -> None:
        self.settings, self.admit, self.windows, self.api = settings, admit, windows, api
        self._versions = versions  # default: the one shared by every user of ``api``
        self.parser = parser
        self.watch_settings = watch
        self.retry_pause_s = retry_pause_s
        self.rewatch_pause_s = rewatch_pause_s
        self.counters = Counters()
        self.version = ""  # the API version being watched, once discovered
        self._limit = asyncio.Semaphore(concurrency)
        self._seen: dict[Key, _Seen] = {}
        self._latest: dict[Key, RawObject] = {}  # the newest version not yet handled
        self._busy: set[Key] = set()
        self._newer: dict[Key, asyncio.Event] = {}  # set when a version arrives mid-retry
        self._tasks: set[asyncio.Task[None]] = set()

    # --- the watch ---------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            async with asyncio.TaskGroup() as tg:
                for ns in self.settings.namespaces or ("",):
                    tg.create_task(self._watch(ns), name=f"kueue-watch-{ns or 'all'}")
        finally:
            await self.stop()

    async def stop(self) -> None:
        """Cancel deliveries in flight (their claims, if stored, are resumed from the cluster)."""
        tasks, self._tasks = set(self._tasks), set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _watch(self, namespace: str) -> None:
        where = f"workloads in {namespace}" if namespace else "workloads"
        # Transient failures come back soon; what a retry cannot fix (RBAC, no Kueue API, a
        # bug) is looked at again later. Both jittered: every replica lost the same apiserver.
        transient = Backoff(self.retry_pause_s, max(self.retry_pause_s, self.rewatch_pause_s))
        lasting = Backoff(
            self.rewatch_pause_s, self.rewatch_pause_s * 6, floor_s=self.rewatch_pause_s / 2
        )
        versions = self._versions
        while True:
            try:
                versions = versions or kueueapi.shared(self.api)
                version = await versions.get()
                if version is None:
                    logs.event(log, "kueue api not served; waiting for it", what=where)
                else:
                    self.version = version
                    endpoint = self._endpoint(version, namespace, where)
                    async for event in watch_objects(
                        endpoint, settings=self.watch_settings, name=f"kueue {where}"
                    ):
                        transient.reset()
                        lasting.reset()
                        self.counters.heard()
                        self.apply(event, namespace)
            except errors.KubeError as e:
                # The watch retries transient failures itself; what lands here is discovery
                # failing (soon retried), RBAC or the CRD going away (looked at again later).
                self.counters.transport_errors += 1
                self.counters.failed(f"{type(e).__name__}: {e}")
                if isinstance(e, errors.NotFound) and versions is not None:
                    versions.forget()  # the Workload API changed: discover it again
                logs.event(log, "kueue watch failed", logging.WARNING, what=where, error=str(e))
                await (transient if e.retriable else lasting).sleep()
                continue
            except Exception as e:  # a source must outlive a bug here: the daemon needs the others
                self.counters.transport_errors += 1
                self.counters.failed(repr(e))
                logs.event(
                    log, "kueue watch crashed", logging.ERROR, what=where, error=repr(e)[:200]
                )
            await lasting.sleep()

    def _endpoint(self, version: str, namespace: str, where: str) -> KubeEndpoint:
        """Workloads of ``namespace``, or of every namespace when it is empty."""
        path = apiserver.group(f"{GROUP}/{version}", PLURAL, namespace=namespace)
        return KubeEndpoint(self.api, path, where, page_size=self.watch_settings.page_size)

    # --- events to deliveries (synchronous: no await between reading and updating state) ------

    def apply(self, event: WatchEvent, namespace: str = "") -> None:
        """Take one watch event: offer its objects for delivery, or forget a deleted one."""
        if isinstance(event, Listed):
            present = {object_key(obj) for obj in event.objects}
            # A Workload deleted while we were not watching: forget it, as DELETED would.
            for key in [k for k in self._seen if (not namespace or k[0] == namespace)]:
                if key not in present:
                    del self._seen[key]
            for obj in event.objects:
                self.offer(obj)
        elif isinstance(event, Changed):
            if event.type == "DELETED":
                key = object_key(event.object)
                self._seen.pop(key, None)
                self._latest.pop(key, None)
            else:
                self.offer(event.object)

    def offer(self, obj: RawObject) -> None:
        """Queue ``obj`` for delivery unless this version of it was already handled."""
        key = object_key(obj)
        seen = self._seen.get(key)
        version = resource_version(obj)
        if seen is not None and version and seen.version == version:
            return
        self._latest[key] = obj  # a newer version replaces one still waiting
        if (newer := self._newer.get(key)) is not None:
            newer.set()  # cut a retry pause short: the new version is handled instead
        if key not in self._busy:
            self._busy.add(key)
            task = asyncio.create_task(self._drain(key), name=f"kueue-{key[0]}/{key[1]}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def wait_idle(self) -> None:
        """Until every offered object is handled (tests, and a graceful stop)."""
        while self._tasks:
            await asyncio.gather(*set(self._tasks), return_exceptions=True)

    async def _drain(self, key: Key) -> None:
        try:
            while (obj := self._latest.pop(key, None)) is not None:
                async with self._limit:
                    await self._deliver(key, obj)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a bug in a step below must not end the source
            self.counters.transport_errors += 1
            logs.event(log, "kueue delivery failed", logging.ERROR, error=str(e)[:200])
        finally:
            self._busy.discard(key)
            self._newer.pop(key, None)

    # --- one object ------------------------------------------------------------------------

    async def _deliver(self, key: Key, obj: RawObject) -> None:
        version = resource_version(obj)
        seen = self._seen.setdefault(key, _Seen())
        delivered = await deliver(
            self.parser,
            json.dumps(obj).encode(),
            admit=self.admit,
            windows=self.windows,
            counters=self.counters,
            what="kueue workload",
            # A follow-up write repeats a notice already admitted: count it, admit it once.
            admit_only=lambda n: n.id not in seen.notice_ids,
            workload=_name(key),
        )
        if delivered.read is not Read.NOTICES:
            # Re-reading the same version cannot fix it; a new version is parsed afresh.
            seen.version = version
            return
        self._settled(delivered.admitted, seen)
        pending = delivered.unsettled
        while pending:
            self.counters.left_for_redelivery += 1
            # No redelivery comes from a watch: retry here, unless a newer version arrived
            # (it carries the same notice if the eviction is the same, and is handled next).
            if not await self._pause_unless_newer(key):
                return
            admissions = await admit_all(self.admit, pending, self.counters)
            self._settled(tuple(zip(pending, admissions, strict=True)), seen)
            pending = [n for n, a in zip(pending, admissions, strict=True) if not a.ack]
        seen.version = version

    def _settled(self, admitted: tuple[tuple[Notice, Admission], ...], seen: _Seen) -> None:
        for notice, admission in admitted:
            if admission.ack:
                self.counters.acked += 1
                seen.notice_ids |= {notice.id}

    async def _pause_unless_newer(self, key: Key) -> bool:
        """Wait the retry pause; False (at once) when a newer version of ``key`` arrives."""
        newer = self._newer.setdefault(key, asyncio.Event())
        if key in self._latest:
            return False
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.retry_pause_s):
                await newer.wait()
        newer.clear()
        return key not in self._latest


def _name(key: Key) -> str:
    return f"{key[0]}/{key[1]}"


# --- built by the registry (reclaimd.handlers.build), for an enabled source ----------------


def build(entry: Entry[KueueSettings], w: Supplies) -> KueueSource:
    s = entry.section(w.settings)
    # No API (a registry built without a cluster, as in a unit test): built all the same, as
    # before; its run() fails and is retried, counted in transport_errors.
    api = cast(ApiServer, w.api)
    return KueueSource(s, admit=w.admit, windows=w.windows, api=api, parser=entry.parse)
