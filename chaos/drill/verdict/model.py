"""A drill's verdict: its checks and its rows (notices, gangs, takeovers, faults, restarts)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from chaos.drill.verdict.facts import FaultFacts, GaveUp, NoticeFacts

# --- verdict ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str = ""
    required: bool = True  # False: shown, not part of the verdict (the scenario opted out)


@dataclass(frozen=True)
class RestartRow:
    """A gang the drill made again (``drill_restart``) and its restart overhead's events."""

    gang: str
    made_at: datetime  # when the replacement's pods were created
    events: int  # restart-overhead events for it (one, when all is well)
    seconds: float | None  # the first event's x_RestartOverheadSeconds
    source: str | None


def restart_summary(rows: Sequence[RestartRow]) -> dict[str, Any]:
    """Restart overhead over the gangs that came back: notice receipt to training again."""
    seconds = sorted(r.seconds for r in rows if r.seconds is not None)
    out: dict[str, Any] = {"gangs": len(rows), "charged": len(seconds)}
    if seconds:
        out |= {
            "p50_s": round(statistics.median(seconds), 3),
            "max_s": round(seconds[-1], 3),
            "sources": sorted({r.source for r in rows if r.source}),
        }
    return out


@dataclass(frozen=True)
class NoticeRow:
    facts: NoticeFacts
    claimed_at: datetime | None = None
    cordoned_at: datetime | None = None
    all_signaled_at: datetime | None = None
    drained_at: datetime | None = None
    deadline: datetime | None = None  # from the trace when reclaimd recorded it
    traced: bool = False
    events: int = 0
    deadline_met: bool | None = None  # None: nothing to be late for (no deadline)
    # seconds of its window when no replica could act (chaos.drill.downtime), and whether a miss
    # is one that window did not allow: then it is shown, and not counted as missed
    nobody_up_s: float = 0.0
    miss_allowed: bool = False

    @property
    def missed(self) -> bool:
        """Late where the window allowed it: what the promise covers."""
        return self.deadline_met is False and not self.miss_allowed

    def after_send(self, t: datetime | None) -> float | None:
        return None if t is None else (t - self.facts.sent_at).total_seconds()

    @property
    def to_drained_s(self) -> float | None:
        return self.after_send(self.drained_at)


@dataclass(frozen=True)
class GangRow:
    name: str
    notice_id: str  # the notice that charged it ("" if none did)
    events: int
    ledger_gpu_s: float | None
    expected_gpu_s: tuple[float, float] | None  # a range when an ack raced the budget
    outcome: str = ""
    deadline_met: bool | None = None
    ranks_asked: int = 0
    ranks_to_ask: int = 0
    pods_left: int = 0
    ranks: int = 0  # pods of the gang


@dataclass(frozen=True)
class Takeover:
    """What became of one open claim the faulted replica held."""

    key: str
    notice_id: str
    by: str  # the holder that wrote it first after the fault ("": nobody did)
    at: datetime | None
    after_s: float | None  # from the fault
    # from the fault, less the time no replica could act (every one paused, killed, not yet
    # back, or the apiserver restarting): the takeover's own time
    net_s: float | None = None


@dataclass(frozen=True)
class HolderChange:
    """A claim rewritten by another holder for the same notice: a takeover.

    ``fault`` names the fault that had the old holder presumed dead then (killed, stopped,
    paused, cut off, not back yet); "" means it had none: a takeover of a live holder.
    ``fenced`` lists what the old holder still did for the notice after it (the steps it began,
    by span name, until it wrote the claim again), which fencing must make harmless or stop."""

    key: str
    notice_id: str
    old: str
    new: str
    at: datetime
    fault: str = ""
    fenced: tuple[str, ...] = ()

    @property
    def of_live_holder(self) -> bool:
        return not self.fault


@dataclass(frozen=True)
class Readiness:
    """What the live replicas' ``/readyz`` said around one stack fault."""

    replicas: int  # replicas sampled
    unready: int  # of them, those that answered anything but 200 (or nothing) at some point
    first_unready_s: float | None  # from the fault: the first such answer
    ready_again_s: float | None  # from the outage's end: every replica answering 200 for good
    samples: int
    # from the fault: every replica that was not ready answering 200 for good (None: none was
    # not ready, or one never was again). stack.sh's outage ends after its own readiness
    # check, which can come after reclaimd's, so ready_again_s alone can read 0.
    ready_after_fault_s: float | None = None


@dataclass(frozen=True)
class FaultRow:
    facts: FaultFacts
    takeovers: tuple[Takeover, ...] = ()
    delayed: int = 0  # ledger events that reached Kafka over DELAYED_S late because of it
    max_delay_s: float | None = None
    readiness: Readiness | None = None  # stack faults with /readyz sampled

    @property
    def taken_over(self) -> tuple[Takeover, ...]:
        return tuple(t for t in self.takeovers if t.by and t.by != self.facts.holder)

    @property
    def resumed(self) -> tuple[Takeover, ...]:
        """Finished by the faulted replica itself (it came back, or a pause ended first)."""
        return tuple(t for t in self.takeovers if t.by and t.by == self.facts.holder)

    @property
    def unrecovered(self) -> tuple[Takeover, ...]:
        return tuple(t for t in self.takeovers if not t.by)

    @property
    def max_takeover_s(self) -> float | None:
        times = [t.after_s for t in self.takeovers if t.by and t.after_s is not None]
        return max(times) if times else None

    @property
    def outage_s(self) -> float | None:
        f = self.facts
        return None if f.ended_at is None else (f.ended_at - f.started_at).total_seconds()

    @property
    def exit_s(self) -> float | None:
        """From the fault to the process gone (kill, fresh_disk, term)."""
        f = self.facts
        return None if f.exited_at is None else (f.exited_at - f.started_at).total_seconds()


@dataclass(frozen=True)
class Summary:
    """The closing table's row: what the drill cost in all."""

    notices: int
    lost: int  # gangs that had to be charged and were not, with nothing left pending
    doubled: int  # gangs charged more than once
    deadlines_missed: int  # notices late where the window allowed it
    max_takeover_s: float | None
    ledger_delay_p50_s: float | None
    ledger_delay_max_s: float | None
    # gangs charged only after the drill gave up waiting, or with their claim still open then
    late: int = 0
    gave_up: bool = False
    over_charged: int = 0  # gangs the ledger charged more GPU-seconds than the ground truth
    under_charged: int = 0
    takeovers: int = 0  # claims of a faulted replica taken over by another
    takeover_p50_s: float | None = None
    takeover_p99_s: float | None = None
    takeover_max_s: float | None = None  # of those taken over (max_takeover_s: resumes too)
    live_takeovers: int = 0  # claims taken from a holder that had no fault then
    fenced_actions: int = 0  # steps an old holder began for a notice after its takeover
    deadlines_nobody_up: int = 0  # notices late that no replica could act for (not missed)
    takeover_raw_max_s: float | None = None  # from the fault, time nobody could act included


@dataclass(frozen=True)
class Verdict:
    scenario: str
    run_id: str
    checks: tuple[Check, ...]
    notices: tuple[NoticeRow, ...]
    gangs: tuple[GangRow, ...]
    faults: tuple[FaultRow, ...] = ()
    summary: Summary | None = None
    holder_changes: tuple[HolderChange, ...] = ()
    gave_up: GaveUp | None = None
    late_gangs: tuple[str, ...] = ()  # charged after the drill gave up
    pending_gangs: tuple[str, ...] = ()  # not charged, claim still open when it gave up
    garbage_sent: int = 0
    span_files: tuple[str, ...] = ()  # where reclaimd's traces are, for `reclaimd postmortem`
    daemons: tuple[tuple[str, Mapping[str, Any]], ...] = ()  # name, what it said as it stopped
    restarts: tuple[RestartRow, ...] = ()  # gangs made again (scenario restart.enabled)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks if c.required)

    @property
    def slowest(self) -> NoticeRow | None:
        drained = [n for n in self.notices if n.to_drained_s is not None]
        return max(drained, key=lambda n: n.to_drained_s or 0.0, default=None)
