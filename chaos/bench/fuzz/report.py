"""What a ``make bench-fuzz`` run found: the JSON result, its checks and the table."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any

from chaos.bench.fuzz.common import ACKED_TRANSPORTS, FLAT_TOLERANCE, TRANSPORTS

if TYPE_CHECKING:
    from chaos.bench.fuzz.run import FuzzRun


# -- the report --


def result(
    run: FuzzRun,
    *,
    counted: dict[str, dict[str, float]],
    drained: dict[str, Any],
    left: dict[str, int],
    timings: dict[str, float],
    exit_code: int | None,
) -> dict[str, Any]:
    per: dict[str, Any] = {}
    for t in TRANSPORTS:
        c = counted.get(t, {})
        reals = [r for r in run.reals if r.transport == t]
        sent = run.sent[t]
        row: dict[str, Any] = {
            "hostile_sent": sent.hostile,
            "real_sent": sent.real,
            "refused_by_transport": sent.refused,
            "received": int(c.get("received", 0)),
            "notices": int(c.get("notices", 0)),
            "ignored": int(c.get("ignored", 0)),
            "parse_errors": int(c.get("parse_errors", 0)),
            "acked": int(c.get("acked", 0)),
            "redeliveries": int(c.get("redeliveries", 0)),
            "transport_errors": int(c.get("errors", 0)),
            "admissions": {
                k.removeprefix("admission_"): int(v)
                for k, v in c.items()
                if k.startswith("admission_")
            },
            "left_on_transport": left.get(t),
            "real_notices": len(reals),
            "real_claimed": sum(r.claimed_after_s is not None for r in reals),
            "real_claimed_after_s": [r.claimed_after_s for r in reals],
            "send_s": timings.get(t),
        }
        messages = sent.hostile + sent.real
        # Every message the daemon read was counted as exactly one of these outcomes.
        consistent = row["received"] == (
            row["parse_errors"] + row["ignored"] + _notice_messages(row)
        )
        # A watch is not a queue: writes close together may reach it as one event (and it
        # also sees Kueue's and reclaimd's own writes), so only its sum is checked.
        row["all_counted"] = consistent and (t == "kueue" or row["received"] >= messages)
        if t == "azure_scheduled" and run.state is not None:  # for the record, not judged
            row["start_requests"] = run.state.azure.approvals
        if t == "kafka_notices":  # a consumer group commits offsets, not messages
            row["all_acked"] = left.get(t) == 0
        elif t in ACKED_TRANSPORTS:
            row["all_acked"] = row["acked"] >= messages and left.get(t) == 0
        per[t] = row
    rss = [v for _, v in run.rss]
    flat = _flat(rss)
    # Each transport's own phase, judged alone: a new kind of payload (200 KB bodies, 32 KB
    # Workloads) raises the high-water mark once; a leak grows within a phase too.
    flat["per_phase"] = {
        name: _flat([v for t, v in run.rss if start <= t <= end])
        for name, (start, end) in run.windows.items()
    }
    checks = {
        "every_phase_ran": not run.errors,
        "no_crash": run.crashed is None,
        "clean_stop_on_sigterm": exit_code == 0,
        "every_message_counted": all(per[t]["all_counted"] for t in TRANSPORTS),
        "every_queued_message_acked": all(per[t]["all_acked"] for t in ACKED_TRANSPORTS),
        "memory_flat": flat["flat"],
        "every_real_notice_claimed": all(r.claimed_after_s is not None for r in run.reals),
        "at_least_per_transport": all(
            run.sent[t].hostile + run.sent[t].real + run.sent[t].refused >= run.args.per_transport
            for t in TRANSPORTS
        ),
    }
    return {
        "run_id": run.run,
        "seed": run.args.seed,
        "per_transport_target": run.args.per_transport,
        "nodes": len(run.aws) + len(run.gce) + len(run.azure),
        "transports": per,
        "process": {
            "crashed_exit": run.crashed,
            "exit_code_on_sigterm": exit_code,
            "rss_mib": flat,
            "rss_samples": run.rss,
        },
        "drain": drained,
        "phase_errors": run.errors,
        "checks": checks,
        "ok": all(checks.values()),
    }


def _notice_messages(row: dict[str, Any]) -> int:
    """Messages that held notices: received minus the unreadable and the ignored, as the
    daemon counts them (one message can hold several notices)."""
    return max(0, int(row["received"]) - int(row["parse_errors"]) - int(row["ignored"]))


def _flat(rss: list[float]) -> dict[str, Any]:
    """Flat: the last quarter's mean within ``FLAT_TOLERANCE`` of the second quarter's."""
    if len(rss) < 8:
        return {"flat": False, "samples": len(rss), "why": "too few samples"}
    q = len(rss) // 4
    second, last = statistics.fmean(rss[q : 2 * q]), statistics.fmean(rss[3 * q :])
    return {
        "flat": last <= second * (1 + FLAT_TOLERANCE),
        "samples": len(rss),
        "first_mib": rss[0],
        "second_quarter_mean_mib": round(second, 1),
        "last_quarter_mean_mib": round(last, 1),
        "peak_mib": max(rss),
        "growth": round(last / second - 1, 3),
    }


def table(result: dict[str, Any]) -> str:
    cols = (
        ("transport", 16),
        ("hostile", 8),
        ("real", 5),
        ("refused", 8),
        ("received", 9),
        ("parse_err", 9),
        ("ignored", 8),
        ("notices", 8),
        ("acked", 7),
        ("left", 5),
        ("claimed", 8),
    )
    lines = [
        "".join(
            name.rjust(width) if i else name.ljust(width) for i, (name, width) in enumerate(cols)
        )
    ]
    for t, row in result["transports"].items():
        values = (
            t,
            row["hostile_sent"],
            row["real_sent"],
            row["refused_by_transport"],
            row["received"],
            row["parse_errors"],
            row["ignored"],
            row["notices"],
            row["acked"] if t in ACKED_TRANSPORTS else "-",
            "-" if row["left_on_transport"] is None else row["left_on_transport"],
            f"{row['real_claimed']}/{row['real_notices']}",
        )
        lines.append(
            "".join(
                str(v).rjust(w) if i else str(v).ljust(w)
                for i, (v, (_, w)) in enumerate(zip(values, cols, strict=True))
            )
        )
    p = result["process"]
    rss = p["rss_mib"]
    lines.append(
        f"process: crashed={p['crashed_exit']} exit on SIGTERM={p['exit_code_on_sigterm']}; "
        f"RSS first {rss.get('first_mib')} MiB, "
        f"2nd-quarter mean {rss.get('second_quarter_mean_mib')}, "
        f"last-quarter mean {rss.get('last_quarter_mean_mib')}, peak {rss.get('peak_mib')} "
        f"({rss.get('samples')} samples, flat={rss['flat']})"
    )
    phases = rss.get("per_phase", {})
    lines.append(
        "RSS per phase (2nd-quarter -> last-quarter mean, MiB): "
        + ", ".join(
            f"{n} {v.get('second_quarter_mean_mib')}->{v.get('last_quarter_mean_mib')}"
            f"{'' if v['flat'] else ' NOT FLAT' if 'why' not in v else ' (too short)'}"
            for n, v in phases.items()
        )
    )
    lines.append("checks: " + ", ".join(f"{k}={v}" for k, v in result["checks"].items()))
    return "\n".join(lines)
