"""A verdict out: ``render`` as a table, ``to_json`` as the drill's JSON report, and the latency
summary both show."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from chaos.drill.verdict.model import FaultRow, NoticeRow, RestartRow, Verdict, restart_summary
from reclaimd.model import rfc3339

SHOWN = 25  # rows of a table before it is cut (the JSON report has them all)


# --- output ----------------------------------------------------------------------------------


def span_text(r: tuple[float, float] | None) -> str:
    if r is None:
        return "-"
    low, high = r
    return f"{low:.3f}" if abs(high - low) < 1e-9 else f"{low:.3f}..{high:.3f}"


def _s(v: float | None) -> str:
    return f"{'-':>6}" if v is None else f"{v:6.2f}"


def pct(values: Sequence[float], q: float) -> float:
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
                "p50": round(pct(values, 50), 3),
                "p95": round(pct(values, 95), 3),
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
            f"  {g.name[:22]:<22} {g.events:>6} {ledger:>12} {span_text(g.expected_gpu_s):>20}"
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
