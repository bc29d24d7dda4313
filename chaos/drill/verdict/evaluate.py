"""``evaluate``: the facts checked against what had to happen, into a ``Verdict`` (pure); the
notices late or still pending, and each notice's and gang's row."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from chaos.drill import downtime
from chaos.drill.verdict.checks import (
    asked_of,
    claims_check,
    deadline_check,
    evicted_check,
    few,
    gpu_check,
    latency_check,
    ledger_check,
    off_by,
    signaled_check,
    split_check,
    trace_check,
)
from chaos.drill.verdict.facts import (
    Expectations,
    FaultFacts,
    GangFacts,
    GaveUp,
    NoticeFacts,
    Observed,
    gang_of,
    natural,
    unique_notices,
)
from chaos.drill.verdict.gpuseconds import expected_gpu_seconds
from chaos.drill.verdict.model import Check, GangRow, NoticeRow, Verdict
from chaos.drill.verdict.silence import ask_budget_check
from chaos.drill.verdict.takeover import fault_row, holder_changes, takeover_summary
from chaos.drill.verdict.traces import ROOT, index_traces, phase_times, time_of


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
            for n in unique_notices(notices)}  # fmt: skip
    charging = [n for n in unique_notices(notices) if n.response != "checkpoint_only"]
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
        ledger_check(expected, events_by_gang, foreign, notices, expect),
        gpu_check(gang_rows, expect),
        deadline_check(rows.values(), observed.events, expect),
        signaled_check(notices, by_gang, events_by_gang, expect),
        evicted_check(expected, by_gang, expect),
        claims_check(notices, observed.claims),
        trace_check(rows.values(), observed.events, traces, expect),
        split_check(observed.events, expect),
    ]
    if expect.max_notice_to_drained_s is not None:
        checks.append(latency_check(rows.values(), expect.max_notice_to_drained_s))
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
    fault_rows = tuple(fault_row(f, observed, traces, nobody) for f in faults)
    if faults:
        broken = [f"{f.label}: {f.error}" for f in faults if f.error]
        checks.append(
            Check(
                "faults applied",
                not broken,
                few(broken, 2) if broken else f"{len(faults)} fault(s), each over as planned",
            )
        )
    if expect.min_ask_budget is not None:
        checks.append(ask_budget_check(faults, notices, by_gang, expect.min_ask_budget))
    terms = [f for f in faults if f.kind == "term"]
    if terms:
        checks.append(_graceful_check(terms))
    late, pending = late_and_pending(expected, events_by_gang, notices, observed)
    checks.insert(0, _waited_check(observed.gave_up, late, pending))
    if late or pending:  # the ledger check says which missing ones were not lost
        checks[1] = _with_late(checks[1], late, pending)
    summary = takeover_summary(
        rows.values(), expected, events_by_gang, fault_rows, observed.arrivals
    )
    summary = dataclasses.replace(
        summary,
        lost=len(expected - set(events_by_gang) - set(pending)),
        late=len(late) + len(pending),
        gave_up=observed.gave_up is not None,
        over_charged=sum(1 for r in gang_rows if off_by(r, expect.gpu_seconds_tolerance) > 0),
        under_charged=sum(1 for r in gang_rows if off_by(r, expect.gpu_seconds_tolerance) < 0),
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
        f"{len(open_)} claim(s) not done ({few(open_, 3)})" if open_ else "every claim done",
    ]
    if late:
        parts.append(f"charged after it (late, not lost): {few(late)}")
    if pending:
        parts.append(f"still pending then (late, not lost): {few(pending)}")
    return Check("drill waited to the end", False, "; ".join(parts))


def _with_late(check: Check, late: Sequence[str], pending: Sequence[str]) -> Check:
    notes = []
    if late:
        notes.append(f"late (charged after the drill gave up): {few(late)}")
    if pending:
        notes.append(f"pending when it gave up, not lost: {few(pending)}")
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
        few(bad, 2) if bad else f"exited 0: {few(good, 3)}",
    )


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
            deadline = time_of(raw) or deadline
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
        stopped = time_of(first.get("ChargePeriodEnd"))
        if stopped is not None:
            expected = expected_gpu_seconds(g, stopped)
        raw = first.get("x_WastedGpuSeconds")
        ledger = float(raw) if isinstance(raw, int | float) else None
    asked, to_ask = asked_of(g, notice_id)
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
