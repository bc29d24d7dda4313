"""Which notice charges a gang: one Lease per gang incarnation, shared by every replica.

A gang with ranks on two doomed nodes gets two notices, and in a storm they may land on two
replicas. The node claims keep each notice single, but only something cluster-wide keeps the
*gang* single: the first notice to create the gang's Lease checkpoints, drains and charges it;
every other notice finds the Lease and leaves the gang alone. The Lease name hashes the gang key
and its member pod uids, so a gang restarted with new pods is a new incarnation and can be
charged again by a later interruption. Creating is the whole protocol: the API server's
uniqueness of names is the lock, and no update is ever needed (a resumed notice finds its own
id in the Lease and carries on).
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any, cast

from kubernetes_asyncio import client as k8s

from reclaimd.cluster import client
from reclaimd.cluster.ratelimit import RateLimiter
from reclaimd.model import Gang, Notice, rfc3339, utcnow

log = logging.getLogger(__name__)

NOTICE_ANNOTATION = "reclaimd.io/notice-id"
GANG_ANNOTATION = "reclaimd.io/gang"


def lease_name(gang: Gang) -> str:
    uids = ",".join(sorted(m.uid for m in gang.members))
    digest = hashlib.sha256(f"{gang.key}\x1f{uids}".encode()).hexdigest()[:32]
    return f"gang-{digest}"


class GangClaims:
    def __init__(
        self, api_client: k8s.ApiClient, namespace: str, holder: str, *, limiter: RateLimiter
    ) -> None:
        self._coord = k8s.CoordinationV1Api(api_client)
        self.namespace = namespace
        self.holder = holder
        self._limiter = limiter

    async def acquire(self, gang: Gang, notice: Notice) -> bool:
        """True when ``notice`` charges ``gang`` (it created the Lease, now or before)."""
        name = lease_name(gang)
        body: dict[str, Any] = {
            "metadata": {
                "name": name,
                "annotations": {NOTICE_ANNOTATION: notice.id, GANG_ANNOTATION: str(gang.key)},
            },
            "spec": {
                "holderIdentity": self.holder,
                "acquireTime": rfc3339(utcnow()),
            },
        }
        await self._limiter.acquire(notice.deadline)
        try:
            with client.kube_errors(f"create lease/{name}"):
                await self._coord.create_namespaced_lease(self.namespace, cast(Any, body))
            return True
        except client.Conflict:
            pass
        with client.kube_errors(f"read lease/{name}"):
            lease = await self._coord.read_namespaced_lease(name, self.namespace)
        owner = (lease.metadata.annotations or {}).get(NOTICE_ANNOTATION, "")
        if owner != notice.id:
            log.info("gang %s is charged by notice %s, not %s", gang.key, owner, notice.id)
        return owner == notice.id
