"""Which Kueue Workload API version this cluster serves: discovered once, used by every part.

v1beta2 is Kueue's storage version since 0.15 (no conversion on the server), v1beta1 the one
older installs serve. The Kueue source, the cluster cache and the claim store must all speak
the version the cluster serves: a Kueue that serves only v1beta1 would otherwise admit
notices whose claims then fail. ``shared(api)`` hands every user of one ApiServer the same
``WorkloadVersion``, so the discovery is one request per process, not one per part.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Iterable, Mapping
from typing import Any

from reclaimd.cluster import errors
from reclaimd.cluster.apiserver import ApiServer

GROUP = "kueue.x-k8s.io"
PLURAL = "workloads"
PREFERRED_VERSIONS = ("v1beta2", "v1beta1")  # storage version first


def pick_version(served: Iterable[str]) -> str | None:
    """The Workload API version to use, of those the cluster serves; None if neither."""
    versions = set(served)
    return next((v for v in PREFERRED_VERSIONS if v in versions), None)


async def served_versions(api: ApiServer, group: str = GROUP) -> list[str]:
    """The versions the API server serves for ``group`` (discovery of ``/apis``, an
    APIGroupList; empty if none).

    Raises ``errors.KubeError`` (with ``retriable``) when discovery itself fails."""
    with errors.kube_errors(f"discover {group}"):
        groups = await api.get("/apis")
    for g in groups.get("groups") or ():
        if isinstance(g, Mapping) and g.get("name") == group:
            return [
                str(v.get("version"))
                for v in g.get("versions") or ()
                if isinstance(v, Mapping) and v.get("version")
            ]
    return []


class WorkloadVersion:
    """The served Workload version, discovered on first use and remembered once found.

    While Kueue is not installed ``get()`` answers None and asks again next time (a Kueue
    installed later is picked up). ``forget()`` after a 404 on the Workload API: the CRD
    changed under us, the next ``get()`` discovers again.
    """

    def __init__(self, api: ApiServer) -> None:
        self._api = api
        self._version = ""
        self._lock = asyncio.Lock()  # one discovery at a time, however many parts ask

    @property
    def known(self) -> str:
        """The version found so far; empty until discovered."""
        return self._version

    async def get(self) -> str | None:
        if self._version:
            return self._version
        async with self._lock:
            if not self._version:
                self._version = pick_version(await served_versions(self._api)) or ""
        return self._version or None

    def forget(self) -> None:
        self._version = ""


_SHARED: weakref.WeakKeyDictionary[Any, WorkloadVersion] = weakref.WeakKeyDictionary()


def shared(api: ApiServer) -> WorkloadVersion:
    """The one ``WorkloadVersion`` of ``api``: every part asking with the same client gets it."""
    found = _SHARED.get(api)
    if found is None:
        found = _SHARED[api] = WorkloadVersion(api)
    return found


async def version_or(api: ApiServer, fallback: str) -> str:
    """The served version (one shared discovery per client), else ``fallback``: Kueue not
    served, or discovery failing. A caller's Workload call then fails as it would have, and
    the next call asks again."""
    try:
        return await shared(api).get() or fallback
    except errors.KubeError:
        return fallback
