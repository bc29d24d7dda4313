"""What every kind of reclaimd Lease shares: deleting one only if nobody wrote it since."""

from __future__ import annotations

import functools
from typing import Any

from kubernetes_asyncio import client as k8s

from reclaimd.cluster import client
from reclaimd.cluster.ratelimit import RateLimiter


async def delete_unchanged(
    coord: k8s.CoordinationV1Api, limiter: RateLimiter, namespace: str, lease: Any
) -> bool:
    """Delete ``lease`` at the version it was read at, last in the write budget (no deadline).
    False when it is gone already or was written since (taken over, renewed): it stays.
    Any other failure is raised."""
    name = lease.metadata.name
    unchanged = k8s.V1Preconditions(resource_version=lease.metadata.resource_version)
    try:
        await limiter.call(
            f"delete lease/{name}",
            None,
            functools.partial(
                coord.delete_namespaced_lease,
                name,
                namespace,
                body=k8s.V1DeleteOptions(preconditions=unchanged),
            ),
        )
    except (client.NotFound, client.Conflict):
        return False
    return True
