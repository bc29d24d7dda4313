"""The ledger's cluster records as its publisher sees them, and whose a row is to send.

A row of the outbox may have a record in the cluster (``cluster.ledgerlog``, through the
``ClusterLog`` shape): the lock on its event id that a peer finds if this replica and its disk
are lost. ``settle`` splits rows about to be published into ours, in doubt (the topic decides)
and given away (a peer holds the record, so it publishes); ``refused_for_good`` says which
record writes no retry can mend.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Final, Protocol

from reclaimd.outbox import Cluster, Row

if TYPE_CHECKING:  # the Kafka side knows the cluster records by shape only
    from reclaimd.cluster.ledgerlog import PendingEvent


class ClusterLog(Protocol):
    """Where pending events are recorded in the cluster (``cluster.ledgerlog.LedgerLog``)."""

    holder: str

    async def put(
        self,
        event_id: str,
        key: bytes | None,
        value: bytes,
        headers: Iterable[tuple[str, bytes]],
        *,
        deadline: datetime | None,
    ) -> bool: ...

    async def records(self) -> list[PendingEvent]: ...

    async def adopt(self, ev: PendingEvent) -> PendingEvent | None: ...

    async def mark_published(self, event_id: str) -> None: ...

    async def sweep(self) -> int: ...


# 400, 404, 422: the request itself, or the namespace, is wrong. Not 401/403: an API server
# just restarted answers 403 until its RBAC caches fill (failover-4020099555: a record
# refused so was published unlocked, and the peer that took the notice over published the
# same event again).
_FOR_GOOD_STATUS: Final = frozenset({400, 404, 422})


def refused_for_good(e: BaseException) -> bool:
    """A cluster record write that can never succeed: too large for an annotation, or a
    status that no retry changes."""
    if getattr(e, "retriable", False):
        return False
    if isinstance(e, ValueError):  # ledgerlog.TooLarge: the encoded event is over the limit
        return True
    return getattr(e, "status", None) in _FOR_GOOD_STATUS


class ClusterUnreadable(Exception):
    """The cluster records could not be read: rows that have one wait for the next round."""


def in_cluster(r: Row) -> bool:
    return r.cluster in (Cluster.HELD, Cluster.UNKNOWN)


def settle(
    rows: Iterable[Row], records: Mapping[str, PendingEvent] | None, holder: str
) -> tuple[list[Row], list[Row], list[Row]]:
    """Split rows about to be published into (ours, in doubt, given away).

    Given away: a peer holds the cluster record (it recorded the event first, or adopted it),
    so it publishes the event; the row waits (``Cluster.PEER``) until then. In doubt: a
    transaction carrying the row was begun before (it may have committed), the row's record
    is gone or its write had no answer (a peer may have published and deleted it), or the
    record is ours by adoption (its first holder may have published it before it died:
    failover-4020099555 published such a row again); the topic decides. ``records`` is
    ``None`` when no row needed the cluster (it was not read).
    """
    ours: list[Row] = []
    doubt: list[Row] = []
    gone: list[Row] = []
    for r in rows:
        held = in_cluster(r)
        rec = records.get(r.id) if records is not None and held else None
        if rec is not None and rec.holder != holder:
            gone.append(r)
        elif (
            r.tried
            or (held and rec is None)
            or (rec is not None and any(h != holder for h in rec.holders))
        ):
            doubt.append(r)
        else:
            ours.append(r)
    return ours, doubt, gone
