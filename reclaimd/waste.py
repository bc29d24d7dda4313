"""Restart waste: the GPU-seconds a gang loses when a notice stops it (ARCHITECTURE §5).

Pure arithmetic over ``model`` values, no I/O. The clock of a rank runs from the later of

* its last good *durable* checkpoint (object storage or otherwise off the doomed machine:
  host memory and local disk die with a spot VM, so only durable saves reset the clock), and
* its pod's ``started_at``: a rank with no known checkpoint has lost everything since its pod
  started, and a rank restarted *after* its last checkpoint only lost what it did since the
  restart (the gap before belongs to the previous interruption's event, not this one),

up to ``stopped_at``. A rank knowing neither time counts zero: the ledger under-reports rather
than invents a start. A clock running backwards (skew, a checkpoint stamped after the stop)
counts zero, never negative.

A gang can span spot and on-demand nodes, so the loss is also split by the node each rank ran
on (``by_node``); ``with_placements`` gives the pipeline a builder that records where each of
those nodes is (instance, SKU, purchase option, zone, cell) so the ledger can price each part
on its own instance.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from types import MappingProxyType
from typing import Any

from reclaimd import checkpoint
from reclaimd.model import (
    CheckpointScope,
    Gang,
    Member,
    Notice,
    RankAck,
    RestartWaste,
    stable_id,
)

MemberId = tuple[str, str]  # (namespace, name): unique among the pods of one gang


def clock_start(member: Member) -> datetime | None:
    """The instant from which this rank's progress is lost (see the module docstring)."""
    known = [t for t in (member.last_checkpoint, member.started_at) if t is not None]
    return max(known) if known else None


def rank_seconds_lost(member: Member, stopped_at: datetime) -> float:
    start = clock_start(member)
    if start is None:
        return 0.0
    return max(0.0, (stopped_at - start).total_seconds())


def gpu_seconds_lost(members_with_last_good: Iterable[Member], stopped_at: datetime) -> float:
    """Sum over ranks of ``gpus x (stopped_at - clock start)``.

    Each member's ``last_checkpoint`` must already be its last good *durable* checkpoint
    (``apply_acks`` does that for the acks of this notice).
    """
    return sum(max(0, m.gpus) * rank_seconds_lost(m, stopped_at) for m in members_with_last_good)


@dataclass(frozen=True)
class NodeLoss:
    """The part of one gang's loss that ran on one node."""

    node: str
    ranks: int
    gpus: int
    gpu_seconds: float


def by_node(members_with_last_good: Iterable[Member], stopped_at: datetime) -> tuple[NodeLoss, ...]:
    """``gpu_seconds_lost`` split by the node each rank ran on (sorted by node name).

    The parts sum to the gang's total: the same per-rank arithmetic, grouped.
    """
    acc: dict[str, list[float]] = {}
    for m in members_with_last_good:
        part = acc.setdefault(m.node, [0, 0, 0.0])
        part[0] += 1
        part[1] += max(0, m.gpus)
        part[2] += max(0, m.gpus) * rank_seconds_lost(m, stopped_at)
    return tuple(NodeLoss(node, int(p[0]), int(p[1]), p[2]) for node, p in sorted(acc.items()))


def _member_id(m: Member) -> MemberId:
    return (m.namespace, m.name)


def _durable_time(ack: RankAck | None) -> datetime | None:
    if ack is None or not (ack.acked and ack.durable):
        return None
    return ack.checkpoint_time


def apply_acks(gang: Gang, acks: Mapping[MemberId, RankAck]) -> tuple[Member, ...]:
    """Members with ``last_checkpoint`` moved forward by this notice's durable acks.

    A durable ack with a time resets the clock (the later of it and the annotation wins: both
    are durable, the newer is the last good one); a non-durable ack leaves it alone. In leader
    scope the leader's durable ack covers every rank, as the contract says.
    """
    if gang.scope is CheckpointScope.LEADER:
        leader = _durable_time(checkpoint.leader_ack(gang, acks.values()))
        times: dict[MemberId, datetime | None] = {_member_id(m): leader for m in gang.members}
    else:
        times = {_member_id(m): _durable_time(acks.get(_member_id(m))) for m in gang.members}
    return tuple(_moved(m, times[_member_id(m)]) for m in gang.members)


def _moved(m: Member, durable_at: datetime | None) -> Member:
    if durable_at is None or (m.last_checkpoint is not None and durable_at <= m.last_checkpoint):
        return m
    return replace(m, last_checkpoint=durable_at)


def event_id(notice: Notice, gang: Gang) -> str:
    """Derived from notice and gang only, so a replay or a second replica yields the same id."""
    return stable_id("rw", notice.id, str(gang.key))


def build_restart_waste(
    notice: Notice,
    gang: Gang,
    acks: Sequence[RankAck],
    stopped_at: datetime,
    *,
    deadline_met: bool,
    traceparent: str = "",
    cluster: str = "",
    placements: Mapping[str, Mapping[str, str]] | None = None,
) -> RestartWaste:
    """One gang's restart waste after ``notice``.

    The returned ``gang`` carries the members as updated by the acks, so the event shows the
    checkpoint times the arithmetic used. ``last_good_checkpoint`` is the earliest rank clock
    start: the start of the charge period that covers every lost GPU-second (``None`` when no
    rank knows any time; never after ``stopped_at``). ``placements`` (node -> instance facts)
    is kept for the nodes of this gang only.
    """
    by_member = {_member_id(a.member): a for a in acks}
    members = apply_acks(gang, by_member)
    starts = [s for s in (clock_start(m) for m in members) if s is not None]
    return RestartWaste(
        event_id=event_id(notice, gang),
        notice=notice,
        gang=replace(gang, members=members),
        gpu_seconds_lost=gpu_seconds_lost(members, stopped_at),
        stopped_at=stopped_at,
        last_good_checkpoint=min(*starts, stopped_at) if starts else None,
        outcome=checkpoint.outcome_of(gang, tuple(acks)),
        deadline_met=deadline_met,
        traceparent=traceparent,
        cluster=cluster,
        placements=MappingProxyType(
            {
                n: MappingProxyType(dict(placements[n]))
                for n in sorted(gang.nodes)
                if placements and n in placements
            }
        ),
    )


Placement = Callable[[str], Mapping[str, str]]


def with_placements(placement: Placement) -> Callable[..., RestartWaste]:
    """``build_restart_waste`` that looks up where each of the gang's nodes is.

    ``placement(node_name)`` returns that node's instance facts (``ledger.placement`` builds
    them from node labels); a lookup that fails leaves the node out, so the ledger falls back
    to the gang's labels for it rather than losing the event.
    """

    def build(notice: Notice, gang: Gang, *args: Any, **kwargs: Any) -> RestartWaste:
        found: dict[str, Mapping[str, str]] = {}
        for node in sorted(gang.nodes):
            try:
                facts = placement(node)
            except Exception:  # a lookup must never cost the gang its event
                continue
            if facts:
                found[node] = facts
        return build_restart_waste(notice, gang, *args, placements=found, **kwargs)

    return build
