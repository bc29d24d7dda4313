"""What every kind of reclaimd Lease shares: deleting one only if nobody wrote it since."""

from __future__ import annotations

import functools

from reclaimd.cluster import apiserver, errors, objects
from reclaimd.cluster.apiserver import ApiServer
from reclaimd.cluster.ratelimit import RateLimiter


async def delete_unchanged(
    api: ApiServer, limiter: RateLimiter, namespace: str, lease: objects.Obj
) -> bool:
    """Delete ``lease`` at the version it was read at, last in the write budget (no deadline).
    False when it is gone already or was written since (taken over, renewed): it stays.
    Any other failure is raised."""
    name = objects.name(lease)
    unchanged = {"preconditions": {"resourceVersion": objects.version(lease)}}
    try:
        await limiter.call(
            f"delete lease/{name}",
            None,
            functools.partial(api.delete, apiserver.lease(namespace, name), unchanged),
        )
    except (errors.NotFound, errors.Conflict):
        return False
    return True
