"""The verdict's checks: ledger, GPU-seconds, deadlines, signals, evictions, claims, traces,
split restarts and latency."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from chaos.drill.verdict.facts import Expectations, GangFacts, NoticeFacts, gang_of, unique_notices
from chaos.drill.verdict.model import Check, GangRow, NoticeRow
from chaos.drill.verdict.render import span_text


def asked_of(g: GangFacts, notice_id: str) -> tuple[int, int]:
    """(ranks that got the request, ranks that had to): every opted-in rank, or the leader,
    but for a rank whose pod the drill stopped before the request (nothing to ask then)."""
    opted = [r for r in g.ranks if r.opted_in and (r.stopped_at is None or notice_id in r.saves)]
    if g.scope == "leader" and opted:
        opted = [next((r for r in opted if r.leader), min(opted, key=lambda r: r.rank))]
    return sum(1 for r in opted if notice_id in r.saves), len(opted)


def off_by(row: GangRow, tolerance: float) -> int:
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


def few(items: Iterable[str], n: int = 4) -> str:
    items = list(items)
    more = f" (+{len(items) - n} more)" if len(items) > n else ""
    return ", ".join(items[:n]) + more


def ledger_check(
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
        f"missing for {few(missing)}" if missing else "",
        f"unexpected for {few(extra + list(foreign))}" if extra or foreign else "",
        f"{few(doubled)} charged more than once" if doubled else "",
        "an EventId repeats" if any(c > 1 for c in ids.values()) else "",
        f"{few(wrong)} charged by a notice that did not touch it" if wrong else "",
    ]
    problems = [p for p in problems if p]
    total = sum(len(es) for es in events.values()) + len(foreign)
    return Check(
        "ledger: one event per affected gang",
        not problems,
        "; ".join(problems) or f"{total} event(s) for {len(expected)} gang(s)",
        required=expect.ledger_exact,
    )


def gpu_check(rows: Sequence[GangRow], expect: Expectations) -> Check:
    charged = [r for r in rows if r.events]
    off = [
        f"{r.name} ledger {r.ledger_gpu_s} vs {span_text(r.expected_gpu_s)}"
        for r in charged
        if not _within(r, expect.gpu_seconds_tolerance)
    ]
    total = sum(r.ledger_gpu_s or 0.0 for r in charged)
    return Check(
        "GPU-seconds equal the ground truth",
        not off,
        few(off, 3) if off else f"{len(charged)} gang(s), {total:.1f} GPU-s lost in all",
        required=expect.ledger_exact,
    )


def deadline_check(
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
        problems.append(f"notices late: {few(late)}")
    if missed:
        problems.append(f"ledger says deadline missed for {few(missed)}")
    beyond = (
        "late while no replica could act (not covered): "
        + few([f"{r.facts.label} ({r.nobody_up_s:.1f}s of its window)" for r in allowed], 3)
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


def signaled_check(
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
    for n in unique_notices(notices):
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
        got, need = max(asked_of(gangs[name], nid) for nid in sorted(ids))
        asked, to_ask = asked + got, to_ask + need
        if got < need:
            short.append(f"{name} {got}/{need}")
    return Check(
        "every rank of every affected gang signaled",
        not short,
        f"short: {few(short)}" if short else f"{asked}/{to_ask} ranks asked",
        required=expect.all_signaled,
    )


def evicted_check(
    expected: set[str], gangs: Mapping[str, GangFacts], expect: Expectations
) -> Check:
    left = [f"{g} ({len(gangs[g].pods_left)} pods)" for g in sorted(expected) if gangs[g].pods_left]
    pods = sum(len(gangs[g].ranks) for g in expected)
    return Check(
        "evictions done",
        not left,
        f"still running: {few(left)}"
        if left
        else f"{pods} pod(s) of {len(expected)} gang(s) gone",
        required=expect.evicted,
    )


def claims_check(notices: Sequence[NoticeFacts], claims: Mapping[str, str]) -> Check:
    keys = sorted({n.claim_key for n in notices if n.claim_key})
    open_ = [f"{k}: {claims.get(k) or 'no claim'}" for k in keys if claims.get(k) != "done"]
    return Check(
        "every claim done",
        not open_,
        f"open: {few(open_)}" if open_ else f"{len(keys)} claim(s) in phase done",
    )


def trace_check(
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
        problems.append(f"no trace for {few(untraced)}")
    if unlinked:
        problems.append(f"event traceparent not in its notice's trace: {few(unlinked)}")
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


def split_check(events: Sequence[Mapping[str, Any]], expect: Expectations) -> Check:
    """Every event's per-instance split adds up to the gang (``reclaimd.restart-waste/v2``)."""
    bad = [f"{gang_of(e)}: {'; '.join(p)}" for e in events if (p := split_problems(e))]
    split = sum(1 for e in events if isinstance(e.get("x_WasteByInstance"), list))
    return Check(
        "waste split by instance sums to the gang",
        not bad,
        few(bad, 3) if bad else f"{split} event(s) split, every split adds up",
        required=expect.ledger_exact,
    )


def latency_check(rows: Iterable[NoticeRow], limit_s: float) -> Check:
    rows = [r for r in rows if r.facts.response != "checkpoint_only"]
    slow = [f"{r.facts.label} {r.to_drained_s:.1f}s" for r in rows
            if r.to_drained_s is not None and r.to_drained_s > limit_s]  # fmt: skip
    never = [r.facts.label for r in rows if r.to_drained_s is None]
    problems = [
        f"slower: {few(slow)}" if slow else "",
        f"never drained: {few(never)}" if never else "",
    ]
    problems = [p for p in problems if p]
    worst = max((r.to_drained_s or 0.0 for r in rows), default=0.0)
    return Check(
        f"notice to drained within {limit_s:g}s",
        not problems,
        "; ".join(problems) or f"slowest {worst:.2f}s",
    )
