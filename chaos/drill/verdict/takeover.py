"""Takeovers (whose claim passed to whom, and what the old holder did after) and what each fault
cost: the readiness lost and the claims taken over."""

from __future__ import annotations

import dataclasses
import itertools
import statistics
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from chaos.drill import downtime
from chaos.drill.verdict.facts import Arrival, ClaimSeen, FaultFacts, Observed
from chaos.drill.verdict.model import (
    FaultRow,
    HolderChange,
    NoticeRow,
    Readiness,
    Summary,
    Takeover,
)
from chaos.drill.verdict.render import pct
from chaos.drill.verdict.traces import _EPOCH, ROOT, index_traces

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


def fault_row(
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


def takeover_summary(
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
        takeover_p50_s=round(pct(each, 50), 3) if each else None,
        takeover_p99_s=round(pct(each, 99), 3) if each else None,
        takeover_max_s=round(max(each), 3) if each else None,
        takeover_raw_max_s=round(max(raw), 3) if raw else None,
    )
