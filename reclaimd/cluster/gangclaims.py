"""Which notice charges a gang: one Lease per gang, shared by every replica.

A gang with ranks on two doomed nodes gets two notices, and in a storm they may land on two
replicas. The node claims keep each notice single, but only something cluster-wide keeps the
*gang* single: the first notice to create the gang's Lease checkpoints, drains and charges it;
every other notice finds the Lease and leaves the gang alone. Creating is the whole protocol
in the common case (one write per gang): the API server's uniqueness of names is the lock.

The Lease is named for the gang's key and records the member pod uids it was taken for. A
later notice that sees the same gang *with fewer pods* (the owner is already draining it) still
finds one of those uids and leaves it alone. A gang restarted with all-new pods is a new
incarnation: it shares no uid with the Lease, and the first notice for it takes the Lease over
(a write with the resourceVersion it read, so two replicas cannot both win) and charges it.
A resumed notice finds its own id in the Lease and carries on.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any, cast

from kubernetes_asyncio import client as k8s

from reclaimd.cluster import client
from reclaimd.cluster.claims import MERGE_PATCH
from reclaimd.cluster.ratelimit import RateLimiter
from reclaimd.model import Gang, Notice, rfc3339, utcnow

log = logging.getLogger(__name__)

NOTICE_ANNOTATION = "reclaimd.io/notice-id"
GANG_ANNOTATION = "reclaimd.io/gang"
PODS_ANNOTATION = "reclaimd.io/pod-uids"


def lease_name(gang: Gang) -> str:
    digest = hashlib.sha256(str(gang.key).encode()).hexdigest()[:32]
    return f"gang-{digest}"


def _uids(gang: Gang) -> set[str]:
    return {m.uid for m in gang.members if m.uid}


class GangClaims:
    def __init__(
        self, api_client: k8s.ApiClient, namespace: str, holder: str, *, limiter: RateLimiter
    ) -> None:
        self._coord = k8s.CoordinationV1Api(api_client)
        self.namespace = namespace
        self.holder = holder
        self._limiter = limiter

    async def acquire(self, gang: Gang, notice: Notice) -> bool:
        """True when ``notice`` charges ``gang`` (it holds the Lease, now or before)."""
        name = lease_name(gang)
        body = self._body(name, gang, notice)
        try:
            await self._limiter.call(
                f"create lease/{name}",
                notice.deadline,
                lambda: self._coord.create_namespaced_lease(self.namespace, cast(Any, body)),
            )
            return True
        except client.Conflict:
            pass
        for _ in range(5):
            with client.kube_errors(f"read lease/{name}"):
                lease = await self._coord.read_namespaced_lease(name, self.namespace)
            notes = lease.metadata.annotations or {}
            owner = notes.get(NOTICE_ANNOTATION, "")
            if owner == notice.id:
                return True
            taken_for = set(filter(None, notes.get(PODS_ANNOTATION, "").split(",")))
            if not taken_for or taken_for & _uids(gang):
                log.info("gang %s is charged by notice %s, not %s", gang.key, owner, notice.id)
                return False
            # A new incarnation of the gang: take the Lease over, if nobody wrote it since.
            body["metadata"]["resourceVersion"] = lease.metadata.resource_version
            try:
                await self._limiter.call(
                    f"take over lease/{name}",
                    notice.deadline,
                    lambda: self._coord.patch_namespaced_lease(
                        name, self.namespace, body, **MERGE_PATCH
                    ),
                )
                return True
            except client.Conflict:
                continue
        return False

    def _body(self, name: str, gang: Gang, notice: Notice) -> dict[str, Any]:
        return {
            "metadata": {
                "name": name,
                "annotations": {
                    NOTICE_ANNOTATION: notice.id,
                    GANG_ANNOTATION: str(gang.key),
                    PODS_ANNOTATION: ",".join(sorted(_uids(gang))),
                },
            },
            "spec": {"holderIdentity": self.holder[:128], "acquireTime": rfc3339(utcnow())},
        }

