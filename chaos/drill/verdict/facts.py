"""What a drill hands its verdict: the ground truth it controlled (the notices it sent, the
gangs it built, what each fake trainer saved) and what it observed of reclaimd."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

ACK_MARGIN_S = 1.0  # reclaimd polls a 202 every 0.5 s: an ack this close to the end is a race
# An ack this close before its replica's SIGKILL may not be written yet (``reclaimd.ackwrites``:
# at once, then every 0.5 s, each write a round trip to the API server): a race too.
RECORD_MARGIN_S = 1.0


# --- facts -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Save:
    """One trainer's handling of one notice's request."""

    received_at: datetime
    deadline: datetime  # when reclaimd stops waiting for this rank
    finished_at: datetime | None  # None: it hung
    saved: bool
    durable: bool
    checkpoint_time: datetime | None
    # When the trainer first answered the finished save (a 200 to the request or to a status
    # poll); None: never. ``answers_known`` says the trainer recorded it.
    answered_at: datetime | None = None
    answers_known: bool = False
    # Answered while a replica was paused, past a deadline inside the same pause (reclaimd
    # cannot tell whether it came in before the deadline), or just before a replica was
    # SIGKILLed (it may not have written the ack yet): ``chaos.drill.judge.save_facts``.
    unplaceable: bool = False

    def counted(self) -> bool | None:
        """Did reclaimd get a durable ack in time? ``None`` when it was too close to call.

        An ack is an answer: a save that finished while its trainer could not answer (a
        drill's trainers share one busy process) is one reclaimd could not have counted, so
        the time judged is when the trainer answered it, where the trainer recorded that."""
        done_at = self.answered_at if self.answers_known else self.finished_at
        if not (self.saved and self.durable) or done_at is None:
            return False
        if self.unplaceable:
            return None
        slack = (self.deadline - done_at).total_seconds()
        if slack > ACK_MARGIN_S:
            return True
        if slack < -ACK_MARGIN_S:
            return False
        return None


@dataclass(frozen=True)
class RankFacts:
    pod: str
    rank: int
    gpus: int
    annotated_checkpoint: datetime | None
    started_at: datetime | None
    opted_in: bool
    leader: bool
    saves: Mapping[str, Save] = field(default_factory=dict)  # by notice id
    # When the drill stopped the pod itself (a scheduler's reclaim): asked or not by then,
    # a rank that is gone cannot be asked after.
    stopped_at: datetime | None = None


@dataclass(frozen=True)
class GangFacts:
    name: str
    namespace: str
    scope: str  # rank | leader
    ranks: tuple[RankFacts, ...]
    pods_left: tuple[str, ...] = ()


@dataclass(frozen=True)
class NoticeFacts:
    label: str  # source#index
    source: str
    kind: str
    target: str
    notice_id: str
    response: str  # full | checkpoint_only | no_cordon
    deadline: datetime | None
    sent_at: datetime
    gangs: tuple[str, ...]  # gangs that had a rank on the target (or the workload's gang)
    copies: int = 1
    claim_key: str = ""  # the object its claim sits on (node or namespace/workload)


@dataclass(frozen=True)
class ClaimSeen:
    """One version of a claim as the drill's poller saw it."""

    seen_at: datetime
    holder: str
    phase: str
    notice_id: str
    heartbeat_at: datetime | None  # the writer's own clock: when it wrote this version


@dataclass(frozen=True)
class Arrival:
    """One ledger record as the drill read it."""

    gang: str
    event_id: str
    produced_at: datetime | None  # the event's ChargePeriodEnd: it exists from then on
    appended_at: datetime | None  # the broker's LogAppendTime
    received_at: datetime  # when the drill's reader got it

    @property
    def delay_s(self) -> float | None:
        if self.produced_at is None:
            return None
        reached = self.appended_at or self.received_at
        return (reached - self.produced_at).total_seconds()


@dataclass(frozen=True)
class FaultFacts:
    """One fault the drill applied (``chaos.drill.faults.FaultRecord``)."""

    label: str
    kind: str
    started_at: datetime
    ended_at: datetime | None  # None: never over (a replica killed for good)
    holder: str = ""  # the faulted replica's holder
    successor: str = ""
    replica: int | None = None  # replica faults: the index (reclaimd-<i>)
    held: Mapping[str, str] = field(default_factory=dict)  # claim key -> notice id, open
    resent: int = 0
    error: str = ""
    # /readyz of the live replicas sampled around a stack fault: when, replica, HTTP status
    readiness: Sequence[tuple[datetime, str, int]] = ()
    # kill, fresh_disk, term: when the process was gone and its exit status (negative: the
    # signal); term: its grace, and whether it outlived it (then SIGKILLed)
    exited_at: datetime | None = None
    exit_code: int | None = None
    grace_s: float | None = None
    sigkilled: bool = False
    connections_cut: int = 0  # partition: apiserver connections open at the cut

    @property
    def presumed_dead_until(self) -> datetime | None:
        """A replica fault's holder may be taken over until then (None: from the fault on,
        for good: killed or stopped for good, or replaced by a new holder)."""
        if not self.holder:
            return None
        if self.ended_at is None or self.successor != self.holder:
            return None
        return self.ended_at


@dataclass(frozen=True)
class GaveUp:
    """The drill stopped waiting (``expect.timeout_s``) with work not done."""

    at: datetime
    timeout_s: float
    events: int  # ledger events read by then
    events_wanted: int  # gangs that had to be charged
    open_claims: Mapping[str, str] = field(default_factory=dict)  # claim key -> its phase
    claim_holders: Mapping[str, str] = field(default_factory=dict)  # claim key -> its holder
    # the holders of the reclaimd processes still running then (paused ones included);
    # None: not known, every open claim counts as work under way
    live_holders: frozenset[str] | None = None

    def under_way(self, key: str) -> bool:
        """The claim was open then and its holder still running: work cut off, not given up."""
        if self.open_claims.get(key, "done") in ("done", ""):
            return False
        if self.live_holders is None:
            return True
        return self.claim_holders.get(key, "") in self.live_holders


@dataclass(frozen=True)
class Observed:
    events: Sequence[Mapping[str, Any]]
    spans: Sequence[Mapping[str, Any]]
    claims: Mapping[str, str]  # claim key -> phase found at the end
    queue_depth: int | None = None  # SQS messages left (garbage included); None: no SQS
    garbage_sent: int = 0
    claim_history: Mapping[str, Sequence[ClaimSeen]] = field(default_factory=dict)
    arrivals: Sequence[Arrival] = ()
    gave_up: GaveUp | None = None  # None: everything was done within the drill's timeout
    # each reclaimd process's own spans, by its holder name (who did what, and when)
    spans_by_holder: Mapping[str, Sequence[Mapping[str, Any]]] = field(default_factory=dict)


@dataclass(frozen=True)
class Expectations:
    deadlines_met: bool = True
    all_signaled: bool = True
    evicted: bool = True
    ledger_exact: bool = True
    gpu_seconds_tolerance: float = 0.05
    max_notice_to_drained_s: float | None = None
    traces: bool = True
    transport_drained: bool = True
    min_ask_budget: float | None = None  # a silent holder's gangs (``verdict.silence``)


def unique_notices(notices: Iterable[NoticeFacts]) -> list[NoticeFacts]:
    """One per notice id: a redelivery (or the same notice named twice) is one notice."""
    seen: dict[str, NoticeFacts] = {}
    for n in notices:
        seen.setdefault(n.notice_id, n)
    return list(seen.values())


def natural(name: str) -> tuple[str, int]:
    """``llm-2`` before ``llm-10``."""
    head, _, tail = name.rpartition("-")
    return (head, int(tail)) if tail.isdigit() else (name, -1)


def gang_of(event: Mapping[str, Any]) -> str:
    return str(event.get("x_GangId", "")).rsplit("/", 1)[-1]
