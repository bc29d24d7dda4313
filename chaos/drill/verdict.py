"""A drill's verdict: what happened, checked against what had to happen (pure).

The drill hands over two kinds of facts. **Ground truth** it controls itself: the notices it
sent (their ids, parsed from the very payloads it sent, and their deadlines), the gangs it
built (each rank's GPUs, the last-checkpoint annotation it wrote, the pod start time it set)
and what every fake trainer received and did. **Observations** of reclaimd: the ledger events
read back from Kafka, the spans of its trace files, what is left of the gangs' pods, the
claims on the targets and the transport's leftovers.

``evaluate`` checks one against the other and returns a ``Verdict``; ``render`` prints it as a
table and ``to_json`` as the drill's JSON report. The GPU-seconds rule is the one in
``reclaimd.waste`` and ARCHITECTURE §5, recomputed here from the ground truth, never from
reclaimd's own numbers: a rank loses ``gpus x (stop - start)`` where ``start`` is the latest of
its annotated checkpoint, its pod's start and, if reclaimd got it in time, the durable
checkpoint it just acked. "In time" is decided from the trainer's record: a save that ended
within ``ACK_MARGIN_S`` of reclaimd's patience could have gone either way, and then the
expected value is a range.
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from chaos.drill import downtime
from reclaimd.model import ParseError, parse_time, rfc3339

ACK_MARGIN_S = 1.0  # reclaimd polls a 202 every 0.5 s: an ack this close to the end is a race
# An ack this close before its replica's SIGKILL may not be written yet (``reclaimd.ackwrites``:
# at once, then every 0.5 s, each write a round trip to the API server): a race too.
RECORD_MARGIN_S = 1.0
SHOWN = 25  # rows of a table before it is cut (the JSON report has them all)


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


def evaluate(
    *,
    scenario: str,
    run_id: str,
    expect: Expectations,
    notices: Sequence[NoticeFacts],
    gangs: Sequence[GangFacts],
    observed: Observed,
    faults: Sequence[FaultFacts] = (),
    replicas: int = 0,  # 0: not known, no miss is put down to nobody being up
) -> Verdict:
    by_gang = {g.name: g for g in gangs}
    nobody = downtime.nobody_up(faults, replicas)
    traces = index_traces(observed.spans)
    changes = holder_changes(
        observed.claim_history,
        faults,
        observed.spans_by_holder,
        claim_keys={n.notice_id: n.claim_key for n in notices if n.claim_key},
    )
    # A notice taken over is drained when its last holder saw its pods gone: the one it
    # took over from may wait on, cut off and blind, until the deadline.
    last = {c.notice_id: c.new for c in sorted(changes, key=lambda c: c.at)}
    takers = set(last.values())
    by_holder = {h: index_traces(s) for h, s in observed.spans_by_holder.items() if h in takers}
    rows = {n.notice_id: _notice_row(n, traces.get(n.notice_id, []), observed.events,
                                     by_holder.get(last.get(n.notice_id, ""), {}).get(n.notice_id),
                                     nobody)
            for n in _unique(notices)}  # fmt: skip
    charging = [n for n in _unique(notices) if n.response != "checkpoint_only"]
    expected = {g for n in charging for g in n.gangs}
    events_by_gang: dict[str, list[Mapping[str, Any]]] = {}
    foreign: list[str] = []
    for e in observed.events:
        name = gang_of(e)
        if name in by_gang and e.get("x_K8sNamespaceName") == by_gang[name].namespace:
            events_by_gang.setdefault(name, []).append(e)
        else:
            foreign.append(str(e.get("x_GangId")))
    gang_rows = tuple(
        _gang_row(by_gang[name], events_by_gang.get(name, []), expect)
        for name in sorted(expected | set(events_by_gang), key=natural)
    )
    checks = [
        _ledger_check(expected, events_by_gang, foreign, notices, expect),
        _gpu_check(gang_rows, expect),
        _deadline_check(rows.values(), observed.events, expect),
        _signaled_check(notices, by_gang, events_by_gang, expect),
        _evicted_check(expected, by_gang, expect),
        _claims_check(notices, observed.claims),
        _trace_check(rows.values(), observed.events, traces, expect),
        _split_check(observed.events, expect),
    ]
    if expect.max_notice_to_drained_s is not None:
        checks.append(_latency_check(rows.values(), expect.max_notice_to_drained_s))
    if observed.queue_depth is not None:
        checks.append(
            Check(
                "transport drained",
                observed.queue_depth == 0,
                f"{observed.queue_depth} message(s) left in the queue"
                f" ({observed.garbage_sent} garbage sent)",
                required=expect.transport_drained,
            )
        )
    fault_rows = tuple(_fault_row(f, observed, traces, nobody) for f in faults)
    if faults:
        broken = [f"{f.label}: {f.error}" for f in faults if f.error]
        checks.append(
            Check(
                "faults applied",
                not broken,
                _few(broken, 2) if broken else f"{len(faults)} fault(s), each over as planned",
            )
        )
    terms = [f for f in faults if f.kind == "term"]
    if terms:
        checks.append(_graceful_check(terms))
    late, pending = late_and_pending(expected, events_by_gang, notices, observed)
    checks.insert(0, _waited_check(observed.gave_up, late, pending))
    if late or pending:  # the ledger check says which missing ones were not lost
        checks[1] = _with_late(checks[1], late, pending)
    summary = _summary(rows.values(), expected, events_by_gang, fault_rows, observed.arrivals)
    summary = dataclasses.replace(
        summary,
        lost=len(expected - set(events_by_gang) - set(pending)),
        late=len(late) + len(pending),
        gave_up=observed.gave_up is not None,
        over_charged=sum(1 for r in gang_rows if _off(r, expect.gpu_seconds_tolerance) > 0),
        under_charged=sum(1 for r in gang_rows if _off(r, expect.gpu_seconds_tolerance) < 0),
        live_takeovers=sum(1 for c in changes if c.of_live_holder),
        fenced_actions=sum(len(c.fenced) for c in changes),
    )
    return Verdict(
        scenario=scenario,
        run_id=run_id,
        checks=tuple(checks),
        notices=tuple(rows.values()),
        gangs=gang_rows,
        faults=fault_rows,
        summary=summary,
        garbage_sent=observed.garbage_sent,
        holder_changes=changes,
        gave_up=observed.gave_up,
        late_gangs=tuple(late),
        pending_gangs=tuple(pending),
    )


# --- late, pending, lost ---------------------------------------------------------------------


def late_and_pending(
    expected: set[str],
    events: Mapping[str, Sequence[Mapping[str, Any]]],
    notices: Sequence[NoticeFacts],
    observed: Observed,
) -> tuple[list[str], list[str]]:
    """Gangs not charged in time that are not lost: ``late``, charged only after the drill gave
    up waiting (an event read while reclaimd stopped, its outbox flushed); ``pending``, never
    charged but with a claim of theirs still open when the drill gave up and held by a process
    still running (work under way, cut off by the drill's timeout). A missing gang that is
    neither is lost: never claimed, or its claim abandoned (its holder gone and nobody took it
    over), or done without an event."""
    g = observed.gave_up
    if g is None:
        return [], []
    first_read: dict[str, datetime] = {}
    for a in observed.arrivals:
        if a.gang not in first_read or a.received_at < first_read[a.gang]:
            first_read[a.gang] = a.received_at
    late = sorted(
        (name for name in expected & set(events) if first_read.get(name, g.at) > g.at),
        key=natural,
    )
    pending = sorted(
        (
            name
            for name in expected - set(events)
            if any(g.under_way(n.claim_key) for n in notices if name in n.gangs and n.claim_key)
        ),
        key=natural,
    )
    return late, pending


def _waited_check(g: GaveUp | None, late: Sequence[str], pending: Sequence[str]) -> Check:
    if g is None:
        return Check("drill waited to the end", True, "every event and claim done in time")
    open_ = [
        f"{k} {phase or 'no claim'}"
        + ("" if g.under_way(k) or not phase else f" by {g.claim_holders.get(k) or '?'}, gone")
        for k, phase in sorted(g.open_claims.items())
    ]
    parts = [
        f"gave up after {g.timeout_s:g}s: {g.events}/{g.events_wanted} event(s)",
        f"{len(open_)} claim(s) not done ({_few(open_, 3)})" if open_ else "every claim done",
    ]
    if late:
        parts.append(f"charged after it (late, not lost): {_few(late)}")
    if pending:
        parts.append(f"still pending then (late, not lost): {_few(pending)}")
    return Check("drill waited to the end", False, "; ".join(parts))


def _with_late(check: Check, late: Sequence[str], pending: Sequence[str]) -> Check:
    notes = []
    if late:
        notes.append(f"late (charged after the drill gave up): {_few(late)}")
    if pending:
        notes.append(f"pending when it gave up, not lost: {_few(pending)}")
    return dataclasses.replace(check, detail=f"{check.detail}; {'; '.join(notes)}")


def _graceful_check(terms: Sequence[FaultFacts]) -> Check:
    """A SIGTERMed replica exits by itself, with status 0, within its grace."""
    bad, good = [], []
    for f in terms:
        took = None if f.exited_at is None else (f.exited_at - f.started_at).total_seconds()
        grace = f"grace {f.grace_s:g}s" if f.grace_s is not None else "no grace"
        if f.sigkilled:
            bad.append(f"{f.label}: still running after its {grace}, SIGKILLed")
        elif took is None:
            bad.append(f"{f.label}: no exit seen")
        elif f.exit_code != 0:
            bad.append(f"{f.label}: exited {f.exit_code} after {took:.1f}s")
        else:
            good.append(f"{f.label} {took:.1f}s ({grace})")
    return Check(
        "SIGTERMed replicas exited within their grace",
        not bad,
        _few(bad, 2) if bad else f"exited 0: {_few(good, 3)}",
    )


# --- takeovers: of whom, and what the old holder did after -----------------------------------

LIVE_SLACK_S = 3.0  # a takeover this soon after the holder came back was decided before
# the steps that act on a notice's target, its ranks or the ledger (a claim write by the old
# holder is a holder change of its own)
ACTION_SPANS = frozenset(
    {
        "reclaimd.cordon",
        "reclaimd.checkpoint.rank",
        "reclaimd.evict",
        "reclaimd.ledger",
    }
)


def holder_changes(
    history: Mapping[str, Sequence[ClaimSeen]],
    faults: Sequence[FaultFacts],
    spans_by_holder: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    claim_keys: Mapping[str, str] | None = None,
) -> tuple[HolderChange, ...]:
    """Every takeover the claim poller saw (a version of a claim, open, for the same notice,
    by a holder other than the previous version's), whether the old holder was presumed dead
    then (a replica fault on it, from its start until it was back, plus ``LIVE_SLACK_S``; for
    good when it never came back under that name), and what it still did after.

    The poller reads the claims every half second and misses a takeover made and finished
    within one read; the span files do not: a notice that two holders worked on (each a trace
    of its own for it; a replica that loses the claim's compare-and-swap starts none) was
    taken over when the second began its first step. Such a change the poller did not see is
    added, named by the notice's claim key (``claim_keys``: notice id -> key)."""
    by_holder = {h: index_traces(spans) for h, spans in spans_by_holder.items()}
    out: list[HolderChange] = []
    for key, versions in sorted(history.items()):
        for i in range(1, len(versions)):
            prev, cur = versions[i - 1], versions[i]
            if (
                cur.notice_id != prev.notice_id
                or not prev.holder
                or not cur.holder
                or cur.holder == prev.holder
                or prev.phase == "done"
            ):
                continue
            at = cur.heartbeat_at or cur.seen_at
            fault = _presumed_dead(prev.holder, at, faults)
            fenced = _fenced(prev.holder, cur.notice_id, at, by_holder, versions[i + 1 :])
            out.append(HolderChange(key, cur.notice_id, prev.holder, cur.holder, at, fault, fenced))
    seen = {(c.notice_id, c.old, c.new) for c in out}
    for notice_id, first in sorted(_first_steps(by_holder).items()):
        ordered = sorted(first.items(), key=lambda kv: kv[1])
        for (old, _), (new, began) in itertools.pairwise(ordered):
            if (notice_id, old, new) in seen:
                continue
            at = _EPOCH + timedelta(microseconds=began // 1000)
            fault = _presumed_dead(old, at, faults)
            fenced = _fenced(old, notice_id, at, by_holder, ())
            key = (claim_keys or {}).get(notice_id, notice_id)
            out.append(HolderChange(key, notice_id, old, new, at, fault, fenced))
    return tuple(sorted(out, key=lambda c: (c.key, c.at)))


def _first_steps(
    by_holder: Mapping[str, Mapping[str, Sequence[Mapping[str, Any]]]],
) -> dict[str, dict[str, int]]:
    """Notice id -> holder -> when it began its first step for the notice (ns), for notices
    more than one holder worked on."""
    first: dict[str, dict[str, int]] = {}
    for holder, traces in by_holder.items():
        for notice_id, spans in traces.items():
            starts = [int(s["start_ns"]) for s in spans if s["name"] != ROOT]
            if starts:
                first.setdefault(notice_id, {})[holder] = min(starts)
    return {n: f for n, f in first.items() if len(f) > 1}


def _presumed_dead(holder: str, at: datetime, faults: Sequence[FaultFacts]) -> str:
    """The label of the fault that had ``holder`` down (or cut off) at ``at``; "" for none."""
    slack = timedelta(seconds=LIVE_SLACK_S)
    for f in faults:
        if f.holder != holder or at < f.started_at:
            continue
        until = f.presumed_dead_until
        if until is None or at <= until + slack:
            return f.label
    return ""


def _fenced(
    holder: str,
    notice_id: str,
    at: datetime,
    by_holder: Mapping[str, Mapping[str, Sequence[Mapping[str, Any]]]],
    later: Sequence[ClaimSeen],
) -> tuple[str, ...]:
    """The steps ``holder`` began for the notice after losing its claim at ``at``, until it
    wrote the claim again (a retake: a change of its own, judged as such)."""
    start = int(at.timestamp() * 1e9)
    back = next((v for v in later if v.holder == holder and v.notice_id == notice_id), None)
    end = None if back is None else int((back.heartbeat_at or back.seen_at).timestamp() * 1e9)
    steps = sorted(
        (int(s["start_ns"]), str(s["name"]).removeprefix("reclaimd."))
        for s in by_holder.get(holder, {}).get(notice_id, ())
        if s["name"] in ACTION_SPANS
        and int(s["start_ns"]) > start
        and (end is None or int(s["start_ns"]) < end)
    )
    return tuple(name for _, name in steps)


# --- what each fault cost --------------------------------------------------------------------

DELAYED_S = 1.0  # a ledger event this much later than its charge reached Kafka late
GONE_S = 2.0  # a replica unsampled this long before /readyz sampling ended went away


def _fault_row(
    f: FaultFacts,
    observed: Observed,
    traces: Mapping[str, Sequence[Mapping[str, Any]]],
    nobody_up: Sequence[downtime.Span] = (),
) -> FaultRow:
    history = observed.claim_history
    takeovers = tuple(
        _net(
            _takeover(f, key, notice_id, history.get(key, ()), traces.get(notice_id, ())),
            f.started_at,
            nobody_up,
        )
        for key, notice_id in sorted(f.held.items())
    )
    end = f.ended_at
    hit = [
        d
        for a in observed.arrivals
        if (d := a.delay_s) is not None
        and d > DELAYED_S
        and a.produced_at is not None
        and (end is None or a.produced_at <= end)
        and a.produced_at + timedelta(seconds=d) >= f.started_at
    ]
    return FaultRow(f, takeovers, len(hit), max(hit) if hit else None, _readiness(f))


def _net(t: Takeover, fault_at: datetime, nobody_up: Sequence[downtime.Span]) -> Takeover:
    """The takeover's time less the time since the fault when no replica could act: a peer
    that could have taken over and did not still counts, the taker's own restart too."""
    if t.at is None or t.after_s is None or not t.by:
        return t
    idle = downtime.seconds_within(nobody_up, fault_at, t.at)
    return dataclasses.replace(t, net_s=max(0.0, t.after_s - idle))


def _readiness(f: FaultFacts) -> Readiness | None:
    if not f.readiness:
        return None
    by_replica: dict[str, list[tuple[datetime, int]]] = {}
    for at, name, status in sorted(f.readiness):
        by_replica.setdefault(name, []).append((at, status))
    # A replica no longer sampled at the end was killed or replaced meanwhile (another
    # fault): what it answered says nothing of this one.
    end = max(at for at, _, _ in f.readiness)
    gone = {
        n for n, answers in by_replica.items() if answers[-1][0] < end - timedelta(seconds=GONE_S)
    }
    by_replica = {n: a for n, a in by_replica.items() if n not in gone}
    unready = [at for at, name, status in f.readiness if status != 200 and name not in gone]
    again: datetime | None = f.ended_at
    recovered: datetime | None = None  # the last replica's first 200 after its last not-ready
    for answers in by_replica.values():
        last_bad = max((at for at, status in answers if status != 200), default=None)
        if last_bad is None:
            continue
        good = [at for at, status in answers if status == 200 and at > last_bad]
        if not good:
            again = recovered = None  # this replica never said ready again while the drill looked
            break
        recovered = good[0] if recovered is None else max(recovered, good[0])
        if again is not None:
            again = max(again, good[0])
    return Readiness(
        replicas=len(by_replica),
        unready=sum(1 for a in by_replica.values() if any(s != 200 for _, s in a)),
        first_unready_s=(min(unready) - f.started_at).total_seconds() if unready else None,
        ready_again_s=None
        if again is None or f.ended_at is None
        else max(0.0, (again - f.ended_at).total_seconds()),
        samples=len(f.readiness),
        ready_after_fault_s=None
        if recovered is None
        else (recovered - f.started_at).total_seconds(),
    )


def _takeover(
    f: FaultFacts,
    key: str,
    notice_id: str,
    history: Sequence[ClaimSeen],
    spans: Sequence[Mapping[str, Any]],
) -> Takeover:
    """The first write of the claim after the fault: who made it, and when.

    When is the earliest of the writer's own stamp on that version (``heartbeat_at``; the
    poller may only have seen a later version) and the end of a ``reclaimd.claim`` span of the
    notice that began after the fault."""
    by, at = "", None
    for seen in history:
        if seen.notice_id != notice_id or seen.seen_at < f.started_at:
            continue
        wrote = seen.heartbeat_at
        if seen.holder == f.holder and (wrote is None or wrote <= f.started_at):
            continue  # the version it held at the fault
        by = seen.holder
        at = wrote if wrote is not None and wrote >= f.started_at else seen.seen_at
        break
    if by:
        start = int(f.started_at.timestamp() * 1e9)
        claimed = [
            _EPOCH + timedelta(microseconds=s["end_ns"] // 1000)
            for s in spans
            if s["name"] == "reclaimd.claim" and s["start_ns"] >= start and s.get("end_ns")
        ]
        if claimed and (at is None or min(claimed) < at):
            at = min(claimed)
    after = None if at is None else (at - f.started_at).total_seconds()
    return Takeover(key, notice_id, by, at, after)


def _summary(
    rows: Iterable[NoticeRow],
    expected: set[str],
    events: Mapping[str, Sequence[Mapping[str, Any]]],
    faults: Sequence[FaultRow],
    arrivals: Sequence[Arrival],
) -> Summary:
    rows = list(rows)
    takeovers = [t for f in faults if (t := f.max_takeover_s) is not None]
    each = [t.net_s for f in faults for t in f.taken_over if t.net_s is not None]
    raw = [t.after_s for f in faults for t in f.taken_over if t.after_s is not None]
    delays = [d for a in arrivals if (d := a.delay_s) is not None]
    return Summary(
        notices=len(rows),
        lost=len(expected - set(events)),
        doubled=sum(1 for es in events.values() if len(es) > 1),
        deadlines_missed=sum(1 for r in rows if r.missed),
        deadlines_nobody_up=sum(1 for r in rows if r.miss_allowed),
        max_takeover_s=max(takeovers) if takeovers else None,
        ledger_delay_p50_s=round(statistics.median(delays), 3) if delays else None,
        ledger_delay_max_s=round(max(delays), 3) if delays else None,
        takeovers=len(each),
        takeover_p50_s=round(_pct(each, 50), 3) if each else None,
        takeover_p99_s=round(_pct(each, 99), 3) if each else None,
        takeover_max_s=round(max(each), 3) if each else None,
        takeover_raw_max_s=round(max(raw), 3) if raw else None,
    )


def _unique(notices: Iterable[NoticeFacts]) -> list[NoticeFacts]:
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


# --- GPU-seconds: the rule, from ground truth ------------------------------------------------


def expected_gpu_seconds(gang: GangFacts, stopped: datetime) -> tuple[float, float]:
    """(low, high) GPU-seconds lost by ``gang`` when its ranks stopped at ``stopped``.

    A rank's clock starts at the latest of its annotated checkpoint, its pod's start and every
    durable checkpoint reclaimd got an ack for in time before the stop: the charging notice's,
    or an earlier one's (a rebalance recommendation's checkpoint is just as good). The two values
    differ only when an ack raced reclaimd's budget: low counts such acks, high does not.
    """
    leader = next((r for r in gang.ranks if r.leader and r.opted_in), None)
    if gang.scope == "leader" and leader is None:
        opted = [r for r in gang.ranks if r.opted_in]
        leader = min(opted, key=lambda r: r.rank) if opted else None
    low = high = 0.0
    for rank in gang.ranks:
        speaker = leader if gang.scope == "leader" else rank
        sure: list[datetime] = [t for t in (rank.annotated_checkpoint, rank.started_at) if t]
        maybe: list[datetime] = []
        for save in speaker.saves.values() if speaker is not None else ():
            t = save.checkpoint_time
            if t is None or t > stopped:
                continue
            counted = save.counted()
            if counted is True:
                sure.append(t)
            elif counted is None:
                maybe.append(t)
        low += _lost(rank.gpus, [*sure, *maybe], stopped)
        high += _lost(rank.gpus, sure, stopped)
    return low, high


def _lost(gpus: int, starts: Sequence[datetime], stopped: datetime) -> float:
    if not starts:
        return 0.0  # no known start: the ledger counts zero rather than invent one
    return gpus * max(0.0, (stopped - max(starts)).total_seconds())


# --- rows ------------------------------------------------------------------------------------


def _notice_row(
    n: NoticeFacts,
    spans: Sequence[Mapping[str, Any]],
    events: Sequence[Mapping[str, Any]],
    last_holders: Sequence[Mapping[str, Any]] | None = None,
    nobody_up: Sequence[downtime.Span] = (),
) -> NoticeRow:
    """``last_holders``: a taken-over notice's spans from the holder that took it last."""
    times = phase_times(spans)
    drained = phase_times(last_holders).get("drained") if last_holders else None
    if drained is not None:
        times["drained"] = drained
    deadline = n.deadline
    for s in spans:
        raw = s["attributes"].get("reclaimd.deadline") if s["name"] == ROOT else None
        if raw:
            deadline = _time(raw) or deadline
    mine = [e for e in events if e.get("x_NoticeId") == n.notice_id]
    met: bool | None = None
    allowed, idle = False, 0.0
    if deadline is not None:
        done = times.get("drained") or times.get("all_signaled")
        met = done is not None and done <= deadline
        met = met and all(e.get("x_DeadlineMet") is True for e in mine)
        if not met:
            allowed, idle = downtime.late_while_nobody_up(deadline, n.sent_at, done, nobody_up)
    return NoticeRow(
        facts=n,
        claimed_at=times.get("claimed"),
        cordoned_at=times.get("cordoned"),
        all_signaled_at=times.get("all_signaled"),
        drained_at=times.get("drained"),
        deadline=deadline,
        traced=bool(spans),
        events=len(mine),
        deadline_met=met,
        nobody_up_s=idle,
        miss_allowed=allowed,
    )


def _gang_row(g: GangFacts, events: Sequence[Mapping[str, Any]], expect: Expectations) -> GangRow:
    first = events[0] if events else None
    notice_id = str(first.get("x_NoticeId", "")) if first else ""
    expected: tuple[float, float] | None = None
    ledger: float | None = None
    if first is not None:
        stopped = _time(first.get("ChargePeriodEnd"))
        if stopped is not None:
            expected = expected_gpu_seconds(g, stopped)
        raw = first.get("x_WastedGpuSeconds")
        ledger = float(raw) if isinstance(raw, int | float) else None
    asked, to_ask = _asked(g, notice_id)
    return GangRow(
        name=g.name,
        notice_id=notice_id,
        events=len(events),
        ledger_gpu_s=ledger,
        expected_gpu_s=expected,
        outcome=str(first.get("x_CheckpointOutcome", "")) if first else "",
        deadline_met=first.get("x_DeadlineMet") if first else None,
        ranks_asked=asked,
        ranks_to_ask=to_ask,
        pods_left=len(g.pods_left),
        ranks=len(g.ranks),
    )


def _asked(g: GangFacts, notice_id: str) -> tuple[int, int]:
    """(ranks that got the request, ranks that had to): every opted-in rank, or the leader,
    but for a rank whose pod the drill stopped before the request (nothing to ask then)."""
    opted = [r for r in g.ranks if r.opted_in and (r.stopped_at is None or notice_id in r.saves)]
    if g.scope == "leader" and opted:
        opted = [next((r for r in opted if r.leader), min(opted, key=lambda r: r.rank))]
    return sum(1 for r in opted if notice_id in r.saves), len(opted)


def _off(row: GangRow, tolerance: float) -> int:
    """+1 charged more than the ground truth, -1 less, 0 within it (or not charged)."""
    if row.ledger_gpu_s is None or row.expected_gpu_s is None:
        return 0
    low, high = row.expected_gpu_s
    return (
        1
        if row.ledger_gpu_s > high + tolerance
        else -1
        if row.ledger_gpu_s < low - tolerance
        else 0
    )


def _within(row: GangRow, tolerance: float) -> bool:
    if row.ledger_gpu_s is None or row.expected_gpu_s is None:
        return False
    low, high = row.expected_gpu_s
    return low - tolerance <= row.ledger_gpu_s <= high + tolerance


# --- checks ----------------------------------------------------------------------------------


def _few(items: Iterable[str], n: int = 4) -> str:
    items = list(items)
    more = f" (+{len(items) - n} more)" if len(items) > n else ""
    return ", ".join(items[:n]) + more


def _ledger_check(
    expected: set[str],
    events: Mapping[str, Sequence[Mapping[str, Any]]],
    foreign: Sequence[str],
    notices: Sequence[NoticeFacts],
    expect: Expectations,
) -> Check:
    missing = sorted(expected - set(events))
    extra = sorted(set(events) - expected)
    doubled = sorted(g for g, es in events.items() if len(es) > 1)
    ids = Counter(str(e.get("EventId")) for es in events.values() for e in es)
    touching = {g: {n.notice_id for n in notices if g in n.gangs} for g in expected}
    wrong = sorted(
        g for g, es in events.items() if g in touching
        for e in es if e.get("x_NoticeId") not in touching[g]
    )  # fmt: skip
    problems = [
        f"missing for {_few(missing)}" if missing else "",
        f"unexpected for {_few(extra + list(foreign))}" if extra or foreign else "",
        f"{_few(doubled)} charged more than once" if doubled else "",
        "an EventId repeats" if any(c > 1 for c in ids.values()) else "",
        f"{_few(wrong)} charged by a notice that did not touch it" if wrong else "",
    ]
    problems = [p for p in problems if p]
    total = sum(len(es) for es in events.values()) + len(foreign)
    return Check(
        "ledger: one event per affected gang",
        not problems,
        "; ".join(problems) or f"{total} event(s) for {len(expected)} gang(s)",
        required=expect.ledger_exact,
    )


def _gpu_check(rows: Sequence[GangRow], expect: Expectations) -> Check:
    charged = [r for r in rows if r.events]
    off = [
        f"{r.name} ledger {r.ledger_gpu_s} vs {_span(r.expected_gpu_s)}"
        for r in charged
        if not _within(r, expect.gpu_seconds_tolerance)
    ]
    total = sum(r.ledger_gpu_s or 0.0 for r in charged)
    return Check(
        "GPU-seconds equal the ground truth",
        not off,
        _few(off, 3) if off else f"{len(charged)} gang(s), {total:.1f} GPU-s lost in all",
        required=expect.ledger_exact,
    )


def _deadline_check(
    rows: Iterable[NoticeRow], events: Sequence[Mapping[str, Any]], expect: Expectations
) -> Check:
    rows = list(rows)
    late = [r.facts.label for r in rows if r.missed]
    allowed = [r for r in rows if r.miss_allowed]
    excused = {r.facts.notice_id for r in allowed}
    missed = [
        gang_of(e)
        for e in events
        if e.get("x_DeadlineMet") is not True and e.get("x_NoticeId") not in excused
    ]
    problems = []
    if late:
        problems.append(f"notices late: {_few(late)}")
    if missed:
        problems.append(f"ledger says deadline missed for {_few(missed)}")
    beyond = (
        "late while no replica could act (not covered): "
        + _few([f"{r.facts.label} ({r.nobody_up_s:.1f}s of its window)" for r in allowed], 3)
        if allowed
        else ""
    )
    return Check(
        "every deadline met",
        not problems,
        "; ".join([*problems, beyond] if beyond else problems)
        or "all notices done before their deadlines",
        required=expect.deadlines_met,
    )


def _signaled_check(
    notices: Sequence[NoticeFacts],
    gangs: Mapping[str, GangFacts],
    events: Mapping[str, Sequence[Mapping[str, Any]]],
    expect: Expectations,
) -> Check:
    """Every opted-in rank (or the leader) of each affected gang got the notice's request:
    a charged gang for the notice that charged it, a checkpoint-only notice's gangs for it."""
    short: list[str] = []
    asked = to_ask = 0
    wanted: dict[str, set[str]] = {}  # gang -> the notices one of which must have asked it
    for n in _unique(notices):
        if n.response == "checkpoint_only":
            for g in n.gangs:
                wanted.setdefault(f"{g} {n.notice_id}", set()).add(n.notice_id)
        else:
            for g in n.gangs:
                wanted.setdefault(g, set()).add(n.notice_id)
    for name, es in events.items():
        wanted[name] = {str(es[0].get("x_NoticeId"))}  # the notice that charged it
    for key, ids in sorted(wanted.items()):
        name = key.split(" ", 1)[0]
        got, need = max(_asked(gangs[name], nid) for nid in sorted(ids))
        asked, to_ask = asked + got, to_ask + need
        if got < need:
            short.append(f"{name} {got}/{need}")
    return Check(
        "every rank of every affected gang signaled",
        not short,
        f"short: {_few(short)}" if short else f"{asked}/{to_ask} ranks asked",
        required=expect.all_signaled,
    )


def _evicted_check(
    expected: set[str], gangs: Mapping[str, GangFacts], expect: Expectations
) -> Check:
    left = [f"{g} ({len(gangs[g].pods_left)} pods)" for g in sorted(expected) if gangs[g].pods_left]
    pods = sum(len(gangs[g].ranks) for g in expected)
    return Check(
        "evictions done",
        not left,
        f"still running: {_few(left)}"
        if left
        else f"{pods} pod(s) of {len(expected)} gang(s) gone",
        required=expect.evicted,
    )


def _claims_check(notices: Sequence[NoticeFacts], claims: Mapping[str, str]) -> Check:
    keys = sorted({n.claim_key for n in notices if n.claim_key})
    open_ = [f"{k}: {claims.get(k) or 'no claim'}" for k in keys if claims.get(k) != "done"]
    return Check(
        "every claim done",
        not open_,
        f"open: {_few(open_)}" if open_ else f"{len(keys)} claim(s) in phase done",
    )


def _trace_check(
    rows: Iterable[NoticeRow],
    events: Sequence[Mapping[str, Any]],
    traces: Mapping[str, Sequence[Mapping[str, Any]]],
    expect: Expectations,
) -> Check:
    rows = list(rows)
    untraced = [r.facts.label for r in rows if not r.traced]
    trace_ids = {nid: {s["trace_id"] for s in spans} for nid, spans in traces.items()}
    unlinked = []
    for e in events:
        tp = str(e.get("x_TraceParent") or "")
        trace_id = tp.split("-")[1] if tp.count("-") == 3 else ""
        if trace_id not in trace_ids.get(str(e.get("x_NoticeId")), set()):
            unlinked.append(gang_of(e))
    problems = []
    if untraced:
        problems.append(f"no trace for {_few(untraced)}")
    if unlinked:
        problems.append(f"event traceparent not in its notice's trace: {_few(unlinked)}")
    return Check(
        "traces present",
        not problems,
        "; ".join(problems) or f"{len(rows)} trace(s), every event linked",
        required=expect.traces,
    )


V2 = "reclaimd.restart-waste/v2"


def split_problems(event: Mapping[str, Any]) -> list[str]:
    """What is wrong with one event's ``x_WasteByInstance`` (empty: nothing, or no split).

    The parts must add up to the gang: their GPU-seconds to ``x_WastedGpuSeconds`` (each
    part and the total are rounded to 0.001, hence the tolerance), their ranks to
    ``x_GangSize`` and their GPUs to ``x_GpuCount``. A v2 event must carry the split.
    """
    parts = event.get("x_WasteByInstance")
    if parts is None:
        return ["v2 event without x_WasteByInstance"] if event.get("schema") == V2 else []
    if not isinstance(parts, list) or not all(isinstance(p, Mapping) for p in parts):
        return ["x_WasteByInstance is not a list of parts"]
    out = []
    total = event.get("x_WastedGpuSeconds")
    seconds = [p.get("x_WastedGpuSeconds") for p in parts]
    if not isinstance(total, int | float) or not all(isinstance(v, int | float) for v in seconds):
        out.append("GPU-seconds missing")
    elif abs(sum(seconds) - total) > 0.0005 * (len(parts) + 1) + 1e-9:
        out.append(f"parts {sum(seconds):.3f} GPU-s vs {total}")
    for part_key, gang_key in (("x_Ranks", "x_GangSize"), ("x_GpuCount", "x_GpuCount")):
        if gang_key in event and sum(p.get(part_key) or 0 for p in parts) != event[gang_key]:
            out.append(f"parts' {part_key} do not sum to {gang_key}")
    return out


def _split_check(events: Sequence[Mapping[str, Any]], expect: Expectations) -> Check:
    """Every event's per-instance split adds up to the gang (``reclaimd.restart-waste/v2``)."""
    bad = [f"{gang_of(e)}: {'; '.join(p)}" for e in events if (p := split_problems(e))]
    split = sum(1 for e in events if isinstance(e.get("x_WasteByInstance"), list))
    return Check(
        "waste split by instance sums to the gang",
        not bad,
        _few(bad, 3) if bad else f"{split} event(s) split, every split adds up",
        required=expect.ledger_exact,
    )


def _latency_check(rows: Iterable[NoticeRow], limit_s: float) -> Check:
    rows = [r for r in rows if r.facts.response != "checkpoint_only"]
    slow = [f"{r.facts.label} {r.to_drained_s:.1f}s" for r in rows
            if r.to_drained_s is not None and r.to_drained_s > limit_s]  # fmt: skip
    never = [r.facts.label for r in rows if r.to_drained_s is None]
    problems = [
        f"slower: {_few(slow)}" if slow else "",
        f"never drained: {_few(never)}" if never else "",
    ]
    problems = [p for p in problems if p]
    worst = max((r.to_drained_s or 0.0 for r in rows), default=0.0)
    return Check(
        f"notice to drained within {limit_s:g}s",
        not problems,
        "; ".join(problems) or f"slowest {worst:.2f}s",
    )


# --- traces ----------------------------------------------------------------------------------

ROOT = "reclaimd.notice"


def index_traces(spans: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """Spans by notice id: every trace whose root names the notice (a resumed notice, or one
    handled again by a peer, has more than one), or, without its root (a process killed
    before the root ended), whose drain or ledger span does."""
    by_trace: dict[str, list[Mapping[str, Any]]] = {}
    notice_of: dict[str, str] = {}
    for s in spans:
        by_trace.setdefault(s["trace_id"], []).append(s)
        named = str(s["attributes"].get("reclaimd.notice.id", ""))
        if s["name"] == ROOT or (s["name"] in ("reclaimd.drain", "reclaimd.ledger") and named):
            notice_of.setdefault(s["trace_id"], named)
    out: dict[str, list[Mapping[str, Any]]] = {}
    for trace_id, notice_id in notice_of.items():
        out.setdefault(notice_id, []).extend(by_trace[trace_id])
    return out


def phase_times(spans: Sequence[Mapping[str, Any]]) -> dict[str, datetime]:
    """When the notice was claimed, cordoned, had every rank asked, and was drained.

    ``all_signaled`` is when the last rank's request went out (the latest start of a
    per-rank span), or when the checkpoint step began if there was nobody to ask.
    """

    def at(ns: int) -> datetime:
        return _EPOCH + timedelta(microseconds=ns // 1000)

    def ends(name: str) -> list[datetime]:
        return [at(s["end_ns"]) for s in spans if s["name"] == name and s.get("end_ns")]

    out: dict[str, datetime] = {}
    for step, name, pick in (
        ("claimed", "reclaimd.claim", min),
        ("cordoned", "reclaimd.cordon", min),
        ("drained", "reclaimd.drain", max),
    ):
        found = ends(name)
        if found:
            out[step] = pick(found)
    ranks = [at(s["start_ns"]) for s in spans if s["name"] == "reclaimd.checkpoint.rank"]
    steps = [at(s["start_ns"]) for s in spans if s["name"] == "reclaimd.checkpoint"]
    if ranks:
        out["all_signaled"] = max(ranks)
    elif steps:
        out["all_signaled"] = min(steps)
    return out


_EPOCH = datetime.fromisoformat("1970-01-01T00:00:00+00:00")


def _time(raw: object) -> datetime | None:
    if not isinstance(raw, str):
        return None
    try:
        return parse_time(raw)
    except ParseError:
        return None


# --- output ----------------------------------------------------------------------------------


def _span(r: tuple[float, float] | None) -> str:
    if r is None:
        return "-"
    low, high = r
    return f"{low:.3f}" if abs(high - low) < 1e-9 else f"{low:.3f}..{high:.3f}"


def _s(v: float | None) -> str:
    return f"{'-':>6}" if v is None else f"{v:6.2f}"


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    return statistics.quantiles(ordered, n=100, method="inclusive")[int(q) - 1]


def latency_summary(v: Verdict) -> dict[str, dict[str, float]]:
    """p50 / p95 / max seconds from each notice's send to each step, over all notices."""
    out: dict[str, dict[str, float]] = {}
    for step in ("claimed_at", "cordoned_at", "all_signaled_at", "drained_at"):
        values = [s for r in v.notices if (s := r.after_send(getattr(r, step))) is not None]
        if values:
            out[step.removesuffix("_at")] = {
                "p50": round(_pct(values, 50), 3),
                "p95": round(_pct(values, 95), 3),
                "max": round(max(values), 3),
                "n": len(values),
            }
    return out


def _met(r: NoticeRow) -> str:
    if r.miss_allowed:
        return f"late, no replica up {r.nobody_up_s:.1f}s of it"
    return {True: "met", False: "MISSED", None: "none"}[r.deadline_met]


def render(v: Verdict, *, all_rows: bool = False) -> str:
    """The table printed at the end of a drill."""
    lines = [f"== drill {v.scenario} (run {v.run_id})", "", "notices (seconds after send):"]
    head = (
        f"  {'notice':<16} {'kind':<20} {'target':<28} {'claim':>6} {'cordon':>6}"
        f" {'signal':>6} {'drain':>6} {'window':>6}  deadline"
    )
    lines.append(head)
    rows = sorted(v.notices, key=lambda r: r.facts.sent_at)
    for r in rows if all_rows else rows[:SHOWN]:
        window = (r.deadline - r.facts.sent_at).total_seconds() if r.deadline is not None else None
        met = _met(r)
        lines.append(
            f"  {r.facts.label:<16} {r.facts.kind[:20]:<20} {r.facts.target[:28]:<28}"
            f" {_s(r.after_send(r.claimed_at))} {_s(r.after_send(r.cordoned_at))}"
            f" {_s(r.after_send(r.all_signaled_at))} {_s(r.after_send(r.drained_at))}"
            f" {_s(window)}  {met}"
        )
    if not all_rows and len(rows) > SHOWN:
        lines.append(f"  ... {len(rows) - SHOWN} more notices in the JSON report")
    summary = latency_summary(v)
    if summary:
        lines.append("")
        lines.append("  step         p50 s   p95 s   max s   notices")
        for step, s in summary.items():
            lines.append(
                f"  {step:<12} {s['p50']:6.2f}  {s['p95']:6.2f}  {s['max']:6.2f}   {int(s['n'])}"
            )
    lines += ["", "gangs (GPU-seconds lost):"]
    lines.append(
        f"  {'gang':<22} {'events':>6} {'ledger':>12} {'expected':>20} {'asked':>7}"
        f" {'left':>4}  outcome"
    )
    for g in v.gangs if all_rows else v.gangs[:SHOWN]:
        ledger = "-" if g.ledger_gpu_s is None else f"{g.ledger_gpu_s:.3f}"
        lines.append(
            f"  {g.name[:22]:<22} {g.events:>6} {ledger:>12} {_span(g.expected_gpu_s):>20}"
            f" {g.ranks_asked:>3}/{g.ranks_to_ask:<3} {g.pods_left:>4}  {g.outcome}"
        )
    if not all_rows and len(v.gangs) > SHOWN:
        lines.append(f"  ... {len(v.gangs) - SHOWN} more gangs in the JSON report")
    lines += _restart_lines(v.restarts)
    if v.faults:
        lines += ["", "faults (seconds after the fault):"]
        lines.append(
            f"  {'fault':<30} {'outage':>6} {'held':>4} {'taken':>5} {'self':>4} {'open':>4}"
            f" {'takeover':>8} {'delayed':>7} {'delay':>6}  successor"
        )
        for f in v.faults:
            lines.append(
                f"  {f.facts.label[:30]:<30} {_s(f.outage_s)} {len(f.takeovers):>4}"
                f" {len(f.taken_over):>5} {len(f.resumed):>4} {len(f.unrecovered):>4}"
                f"   {_s(f.max_takeover_s)} {f.delayed:>7} {_s(f.max_delay_s)}"
                f"  {f.facts.successor or '-'}"
                + (f"  ERROR {f.facts.error}" if f.facts.error else "")
            )
            if f.facts.kind == "term":
                exit_ = (
                    "no exit seen"
                    if f.exit_s is None
                    else f"exited {f.facts.exit_code} {f.exit_s:.2f}s after SIGTERM"
                )
                killed = ", SIGKILLed after its grace" if f.facts.sigkilled else ""
                grace = f" (grace {f.facts.grace_s:g}s)" if f.facts.grace_s is not None else ""
                lines.append(f"    exit: {exit_}{grace}{killed}")
            if f.facts.kind == "partition":
                lines.append(
                    f"    partition: {f.facts.connections_cut} apiserver connection(s) held at"
                    " the cut"
                )
            if (ready := f.readiness) is not None:
                lines.append(
                    f"    /readyz: {ready.unready}/{ready.replicas} replica(s) answered not-ready"
                    f" (first {_opt(ready.first_unready_s)} after the fault), all ready again"
                    f" {_opt(ready.ready_again_s)} after the outage"
                    f" ({_opt(ready.ready_after_fault_s)} after the fault, {ready.samples} samples)"
                )
    if v.holder_changes:
        lines += ["", "takeovers (claims rewritten by another holder):"]
        for change in v.holder_changes[: None if all_rows else SHOWN]:
            why = f"presumed dead ({change.fault})" if change.fault else "LIVE HOLDER (no fault)"
            did = ", ".join(change.fenced)
            fenced = f"; after it the old holder did: {did}" if did else ""
            lines.append(
                f"  {change.key[:40]:<40} {change.old} -> {change.new} at {_iso(change.at)}:"
                f" {why}{fenced}"
            )
        if not all_rows and len(v.holder_changes) > SHOWN:
            lines.append(f"  ... {len(v.holder_changes) - SHOWN} more in the JSON report")
    if v.summary is not None:
        u = v.summary
        lines += [
            "",
            f"summary: {u.notices} notices, {u.lost} gang(s) lost, {u.late} late,"
            f" {u.doubled} doubled, {u.over_charged} over-charged, {u.under_charged}"
            f" under-charged, {u.deadlines_missed} deadline(s) missed"
            f" ({u.deadlines_nobody_up} more late while no replica could act),"
            f" takeover p50 {_opt(u.takeover_p50_s)} p99 {_opt(u.takeover_p99_s)}"
            f" max {_opt(u.takeover_max_s)} ({u.takeovers} taken over, less the time no replica"
            f" could act; from the fault max {_opt(u.takeover_raw_max_s)}; with resumes, max"
            f" {_opt(u.max_takeover_s)}), {u.live_takeovers} takeover(s) of"
            f" a live holder, {u.fenced_actions} action(s) by a fenced holder,"
            f" ledger delay p50 {_opt(u.ledger_delay_p50_s)} max {_opt(u.ledger_delay_max_s)}"
            + (" (the drill GAVE UP waiting)" if u.gave_up else ""),
        ]
    lines += ["", "checks:"]
    for c in v.checks:
        mark = "PASS" if c.ok else ("FAIL" if c.required else "info")
        lines.append(f"  [{mark}] {c.name}: {c.detail}")
    lines += ["", f"== verdict: {'PASS' if v.ok else 'FAIL'}"]
    return "\n".join(lines)


def _opt(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}s"


def _iso(t: datetime | None) -> str | None:
    return rfc3339(t) if t is not None else None


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def _fault_json(f: FaultRow) -> dict[str, Any]:
    return {
        "fault": f.facts.label,
        "kind": f.facts.kind,
        "started_at": _iso(f.facts.started_at),
        "ended_at": _iso(f.facts.ended_at),
        "outage_s": _r(f.outage_s),
        "holder": f.facts.holder or None,
        "successor": f.facts.successor or None,
        "resent": f.facts.resent,
        "error": f.facts.error or None,
        "exited_at": _iso(f.facts.exited_at),
        "exit_s": _r(f.exit_s),
        "exit_code": f.facts.exit_code,
        "grace_s": f.facts.grace_s,
        "sigkilled": f.facts.sigkilled,
        "connections_cut": f.facts.connections_cut,
        "claims_held": len(f.takeovers),
        "taken_over": len(f.taken_over),
        "resumed_by_itself": len(f.resumed),
        "never_recovered": len(f.unrecovered),
        "max_takeover_s": _r(f.max_takeover_s),
        "ledger_events_delayed": f.delayed,
        "max_ledger_delay_s": _r(f.max_delay_s),
        "readyz": None
        if (r := f.readiness) is None
        else {
            "replicas": r.replicas,
            "unready": r.unready,
            "first_unready_s": _r(r.first_unready_s),
            "ready_again_s": _r(r.ready_again_s),
            "ready_after_fault_s": _r(r.ready_after_fault_s),
            "samples": r.samples,
        },
        "takeovers": [
            {
                "claim": t.key,
                "notice_id": t.notice_id,
                "by": t.by or None,
                "at": _iso(t.at),
                "after_s": _r(t.after_s),
                "net_s": _r(t.net_s),
            }
            for t in f.takeovers
        ],
    }


def _restart_lines(rows: Sequence[RestartRow]) -> list[str]:
    if not rows:
        return []
    s = restart_summary(rows)
    lines = ["", f"restart overhead: {s['gangs']} gang(s) made again, {s['charged']} charged"]
    if s["charged"]:
        lines.append(
            f"  notice received to training again: p50 {s['p50_s']:.2f} s, max"
            f" {s['max_s']:.2f} s ({', '.join(s['sources'])})"
        )
    return lines


def to_json(v: Verdict) -> dict[str, Any]:
    """The ``--json`` report: every notice and every gang, with the checks."""
    slowest = v.slowest
    return {
        "scenario": v.scenario,
        "run_id": v.run_id,
        "ok": v.ok,
        "checks": [
            {"name": c.name, "ok": c.ok, "required": c.required, "detail": c.detail}
            for c in v.checks
        ],
        "latency_s": latency_summary(v),
        "slowest_notice": slowest.facts.notice_id if slowest else None,
        "summary": dataclasses.asdict(v.summary) if v.summary is not None else None,
        "faults": [_fault_json(f) for f in v.faults],
        "gave_up": None
        if (g := v.gave_up) is None
        else {
            "at": _iso(g.at),
            "timeout_s": g.timeout_s,
            "events": g.events,
            "events_wanted": g.events_wanted,
            "open_claims": dict(g.open_claims),
            "claim_holders": dict(g.claim_holders),
            "live_holders": None if g.live_holders is None else sorted(g.live_holders),
        },
        "late_gangs": list(v.late_gangs),
        "pending_gangs": list(v.pending_gangs),
        "holder_changes": [
            {
                "claim": c.key,
                "notice_id": c.notice_id,
                "from": c.old,
                "to": c.new,
                "at": _iso(c.at),
                "presumed_dead_by": c.fault or None,
                "live_holder": c.of_live_holder,
                "fenced_actions": list(c.fenced),
            }
            for c in v.holder_changes
        ],
        "span_files": list(v.span_files),
        "garbage_sent": v.garbage_sent,
        "restart_overhead": restart_summary(v.restarts) if v.restarts else None,
        "restarts": [
            {
                "gang": r.gang,
                "made_at": _iso(r.made_at),
                "events": r.events,
                "seconds": r.seconds,
                "source": r.source,
            }
            for r in v.restarts
        ],
        "daemons": {name: dict(stats) for name, stats in v.daemons},
        "notices": [
            {
                "label": r.facts.label,
                "notice_id": r.facts.notice_id,
                "source": r.facts.source,
                "kind": r.facts.kind,
                "response": r.facts.response,
                "target": r.facts.target,
                "copies_sent": r.facts.copies,
                "sent_at": _iso(r.facts.sent_at),
                "deadline": _iso(r.deadline),
                "claimed_at": _iso(r.claimed_at),
                "cordoned_at": _iso(r.cordoned_at),
                "all_signaled_at": _iso(r.all_signaled_at),
                "drained_at": _iso(r.drained_at),
                "to_drained_s": r.to_drained_s,
                "deadline_met": r.deadline_met,
                "nobody_up_s": round(r.nobody_up_s, 3),
                "miss_allowed": r.miss_allowed,
                "traced": r.traced,
                "ledger_events": r.events,
                "gangs": list(r.facts.gangs),
            }
            for r in sorted(v.notices, key=lambda r: r.facts.sent_at)
        ],
        "gangs": [
            {
                "gang": g.name,
                "notice_id": g.notice_id,
                "ledger_events": g.events,
                "ledger_gpu_seconds": g.ledger_gpu_s,
                "expected_gpu_seconds": list(g.expected_gpu_s) if g.expected_gpu_s else None,
                "checkpoint_outcome": g.outcome,
                "deadline_met": g.deadline_met,
                "ranks_asked": g.ranks_asked,
                "ranks_to_ask": g.ranks_to_ask,
                "pods_left": g.pods_left,
                "ranks": g.ranks,
            }
            for g in v.gangs
        ],
    }
