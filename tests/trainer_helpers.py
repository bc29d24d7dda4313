"""Builders the trainer tests share: a Spot interruption notice and a team-a JobSet gang."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime, timedelta

from reclaimd.model import Gang, GangKey, Member, Notice, NoticeKind, Target, utcnow


def spot_notice(
    prefix: str,
    *,
    now: datetime | None = None,
    instance_id: str = "i-0abc",
    node_name: str = "n",
    window_s: float = 60,
    unique: bool = True,
) -> Notice:
    """A Spot interruption ``ec2-<prefix>[-<8 hex>]`` issued at ``now``, due ``window_s`` later."""
    now = utcnow() if now is None else now
    return Notice(
        id=f"ec2-{prefix}-{uuid.uuid4().hex[:8]}" if unique else f"ec2-{prefix}",
        source="ec2",
        kind=NoticeKind.SPOT_INTERRUPTION,
        target=Target(instance_id=instance_id, node_name=node_name),
        issued_at=now,
        deadline=now + timedelta(seconds=window_s),
        received_at=now,
    )


def jobset_gang(name: str, members: Iterable[Member]) -> Gang:
    """The gang of JobSet ``team-a/<name>`` with ``members`` in order."""
    return Gang(key=GangKey("jobset", "team-a", name), members=tuple(members))
