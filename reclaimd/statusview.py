"""``reclaimd status`` as text: one screen, widest facts first, nothing wrapped.

Pure: a ``status.Status`` in, lines out (``--watch`` redraws them; ``--format json`` skips
this module).
"""

from __future__ import annotations

from collections.abc import Sequence

from reclaimd.status import GangView, ReplicaView, Status


def render(s: Status) -> str:
    lines = [f"reclaimd status  {s.at}  namespace {s.namespace}", ""]
    lines.append(f"NOTICES IN FLIGHT ({len(s.in_flight)})")
    if s.in_flight:
        lines += _table(
            ("SOURCE", "KIND", "TARGET", "PHASE", "HOLDER", "DEADLINE IN", "GANGS", "NOTICE"),
            [
                (
                    n.source,
                    n.kind,
                    n.target,
                    n.phase,
                    n.holder + ("" if n.holder_alive else " (not alive)"),
                    _left(n.seconds_left),
                    str(len(n.gangs)),
                    n.notice_id,
                )
                for n in s.in_flight
            ],
        )
    else:
        lines.append("  none")
    gangs = [g for n in s.in_flight for g in n.gangs]
    lines += ["", f"GANGS OF THOSE NOTICES ({len(gangs)})"]
    if gangs:
        lines += _table(
            ("GANG", "RANKS ASKED", "ACKED", "DURABLE", "PODS LEFT", "HOLDER", "NOTICE"),
            [_gang_row(g) for g in gangs],
        )
        lines.append("  (acks reach the cluster once, durable ones, before the drain: ACKED is")
        lines.append("   a floor from then on, '-' before; PODS LEFT counts pods not deleting)")
    else:
        lines.append("  none")
    lines += ["", f"REPLICAS ({len(s.replicas)})"]
    if s.replicas:
        lines += _table(
            (
                "HOLDER",
                "ALIVE",
                "LAST RENEWAL",
                "SLOTS",
                "IN FLIGHT",
                "OUTBOX",
                "OLDEST",
                "WRITES WAITING",
            ),
            [_replica_row(r) for r in s.replicas],
        )
        for r in s.replicas:
            if r.metrics is None:
                lines.append(f"  {r.holder}: {r.metrics_error}")
    else:
        lines.append("  none")
    lines += ["", f"LAST FINISHED ({len(s.finished)})"]
    if s.finished:
        lines += _table(
            ("FINISHED", "SOURCE", "KIND", "TARGET", "OUTCOME", "HOLDER", "NOTICE"),
            [
                (f.finished_at, f.source, f.kind, f.target, f.outcome, f.holder, f.notice_id)
                for f in s.finished
            ],
        )
    else:
        lines.append("  none")
    lines += [f"note: {n}" for n in s.notes]
    return "\n".join(lines) + "\n"


def _left(seconds: float | None) -> str:
    if seconds is None:
        return "none"
    return f"{seconds:.0f}s" if seconds >= 0 else f"{-seconds:.0f}s ago"


def _count(value: int | float | None) -> str:
    return "-" if value is None else f"{value:g}"


def _gang_row(g: GangView) -> tuple[str, ...]:
    # Acks reach the cluster once, durable ones only, before the drain: until then "-".
    return (
        g.gang,
        str(g.asked),
        "-" if g.durable is None else f">={g.durable}",
        _count(g.durable),
        _count(g.pods_left),
        g.holder,
        g.notice_id,
    )


def _replica_row(r: ReplicaView) -> tuple[str, ...]:
    alive = "yes" if r.alive else ("released" if r.released else "no")
    m = r.metrics
    oldest = "-" if m is None or m.outbox_oldest_s is None else f"{m.outbox_oldest_s:.0f}s"
    return (
        r.holder,
        alive,
        f"{r.seconds_since_renewal:.1f}s ago" if not r.released else r.last_renewal,
        ",".join(r.slots) or "-",
        _count(m.in_flight) if m else "?",
        _count(m.outbox_depth) if m else "?",
        oldest if m else "?",
        _count(m.writes_waiting) if m else "?",
    )


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(str(c)) for c in col) for col in zip(head, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return "  " + "  ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True))

    return [line(head).rstrip(), *(line(r).rstrip() for r in rows)]
