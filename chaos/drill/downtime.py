"""When the drill's own faults left a replica, or every replica, unable to act.

The judge needs this twice. A deadline missed while no replica could act (one killed for good,
the other paused through the deadline) is outside what reclaimd promises: the window did not
allow it. And a takeover is timed less the time nobody could act since the fault (every
replica paused, killed or not yet back, or the apiserver restarting). Both figures are shown
next to the raw ones, never in their place.

A replica cannot act from a kill, pause, partition (no apiserver), SIGTERM or fresh disk
until it, or its successor, is back; every replica cannot act while the apiserver restarts.
A Kafka, moto or Pub/Sub outage does not stop a cordon or a drain, so it does not count.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Protocol

FOREVER = datetime.max.replace(tzinfo=UTC)
# The takeover target (issue 17: p99 <= 5 s): a notice done later than this after the time
# nobody could act ended was missed while a replica could act.
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
    """Stack faults that stop every replica's cordons and drains. One that never ended (it
    failed: the "faults applied" check says so) counts for nothing rather than for ever."""
    return _merge((f.started_at, f.ended_at) for f in faults if f.kind in _ALL_DOWN and f.ended_at)


def replica_down(faults: Iterable[Fault]) -> dict[int, list[Span]]:
    """Each faulted replica index's spans unable to act: its own faults (one with no end is for
    good) and the stack's."""
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


def late_while_nobody_up(
    deadline: datetime, sent_at: datetime, done: datetime | None, nobody: Sequence[Span]
) -> tuple[bool, float]:
    """(the miss is one the window did not allow, seconds of the window nobody could act).

    Allowed only for a notice done late, at all, where nobody could act from before its
    deadline until less than the allowance before it (or past it), and done within the
    allowance after that stretch ended. Nobody up earlier in the window, with a replica up
    through its end, does not excuse a miss: that replica had the rest of the window."""
    idle = seconds_within(nobody, sent_at, deadline)
    if done is None or done <= deadline:  # on time by its trace: a ledger's miss stands
        return False, idle
    allowance = timedelta(seconds=TAKEOVER_ALLOWANCE_S)
    for a, b in nobody:
        if a < deadline and b > deadline - allowance and done <= b + allowance:
            return True, idle
    return False, idle
