"""When the drill's own faults left a replica, or every replica, unable to act.

The judge needs this twice. A deadline missed while no replica could act (one killed for good,
the other paused through the deadline) is outside what reclaimd promises: the window did not
allow it. And a takeover is timed from when the taker could act, not from the fault, when the
taker was itself paused or not yet up. Both figures are shown next to the raw ones, never in
their place.

A replica cannot act from a kill, pause, partition (no apiserver), SIGTERM or fresh disk
until it, or its successor, is back; every replica cannot act while the apiserver restarts.
A Kafka, moto or Pub/Sub outage does not stop a cordon or a drain, so it does not count.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Protocol

FOREVER = datetime.max.replace(tzinfo=UTC)
# What the takeover target allows on top of the time nobody could act (issue 17: p99 <= 5 s):
# a notice later than its deadline by more than that was missed while someone could act.
TAKEOVER_ALLOWANCE_S = 5.0

Span = tuple[datetime, datetime]

_ALL_DOWN = frozenset({"restart_apiserver"})


class Fault(Protocol):
    """What this module reads of ``report.FaultFacts``."""

    @property
    def kind(self) -> str: ...
    @property
    def replica(self) -> int | None: ...
    @property
    def started_at(self) -> datetime: ...
    @property
    def ended_at(self) -> datetime | None: ...
    @property
    def holder(self) -> str: ...
    @property
    def successor(self) -> str: ...


def _merge(spans: Iterable[Span]) -> list[Span]:
    out: list[Span] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _intersect(xs: Sequence[Span], ys: Sequence[Span]) -> list[Span]:
    out: list[Span] = []
    for a, b in xs:
        for c, d in ys:
            lo, hi = max(a, c), min(b, d)
            if lo < hi:
                out.append((lo, hi))
    return _merge(out)


def seconds_within(spans: Iterable[Span], start: datetime, end: datetime) -> float:
    """How much of [start, end] the spans cover."""
    total = 0.0
    for a, b in _merge(spans):
        lo, hi = max(a, start), min(b, end)
        if lo < hi:
            total += (hi - lo).total_seconds()
    return total


def everyone_down(faults: Iterable[Fault]) -> list[Span]:
    """Stack faults that stop every replica's cordons and drains."""
    return _merge((f.started_at, f.ended_at or FOREVER) for f in faults if f.kind in _ALL_DOWN)


def replica_down(faults: Iterable[Fault]) -> dict[int, list[Span]]:
    """Each replica index's spans unable to act, its own faults and the stack's."""
    faults = list(faults)
    shared = everyone_down(faults)
    own: dict[int, list[Span]] = {}
    for f in faults:
        if f.replica is not None and f.kind not in _ALL_DOWN:
            own.setdefault(f.replica, []).append((f.started_at, f.ended_at or FOREVER))
    return {i: _merge([*spans, *shared]) for i, spans in own.items()}


def nobody_up(faults: Iterable[Fault], replicas: int) -> list[Span]:
    """When no replica could act; empty when the replica count is not known (0)."""
    faults = list(faults)
    if replicas <= 0:
        return []
    down = replica_down(faults)
    if len(down) < replicas:  # a replica with no fault of its own was up but for the stack
        return everyone_down(faults)
    spans = down.get(0, [])
    for i in range(1, replicas):
        spans = _intersect(spans, down.get(i, []))
    return spans


def replica_of(faults: Iterable[Fault]) -> Mapping[str, int]:
    """Holder -> replica index, for every holder a fault names."""
    out: dict[str, int] = {}
    for f in faults:
        if f.replica is None:
            continue
        for h in (f.holder, f.successor):
            if h:
                out.setdefault(h, f.replica)
    return out


def late_while_nobody_up(
    deadline: datetime, sent_at: datetime, done: datetime | None, nobody: Sequence[Span]
) -> tuple[bool, float]:
    """(the miss is one the window did not allow, seconds of the window nobody could act).

    Allowed only when it was done at all and no later than the time nobody could act plus the
    takeover allowance: a miss longer than that happened while a replica could have acted."""
    idle = seconds_within(nobody, sent_at, deadline)
    if done is None or idle <= 0.0:
        return False, idle
    late = (done - deadline).total_seconds()
    return late <= idle + TAKEOVER_ALLOWANCE_S, idle
