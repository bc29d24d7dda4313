"""The report's four faces: a text table, JSON, CSV and one self-contained HTML page.

Money is shown to the cent and hours to 0.01 in the table; JSON and CSV carry money to the
cent and hours to six places. Only group keys (values of one allowlisted label) and figures
appear: no ids, no node or pod names; with ``--detail`` only, the cloud instance ids of the
idle instance-hours (the bill's ids, asked for by name).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from html import escape
from typing import Any, Final

from reclaimd.report import spotpays
from reclaimd.report.engine import COLUMNS, COUNTS, Group, Idle, Window

MONEY: Final = frozenset(
    {"allocated_cost", "cost_spot", "cost_on_demand", "cost_reserved", "cost_capacity_block"}
    | {"reserved_idle_cost", "unallocated_cost", "restart_waste_cost", "effective_cost"}
    | {"restart_overhead_cost", "spot_net_savings", "spot_on_demand_cost", "spot_waste_cost"}
    | {"spot_overhead_cost"}
)
# Bar colours (the Chromium test looks for them): cost by purchase option, waste on top.
# Restart overhead has no segment: it is part of the cost bars already (not additive).
COLOURS: Final = {
    "cost_reserved": "#1f4e79",
    "cost_capacity_block": "#7f5fa8",
    "cost_on_demand": "#2e86c1",
    "cost_spot": "#27ae60",
    "reserved_idle_cost": "#9e9e9e",
    "unallocated_cost": "#c8b88a",
    "restart_waste_cost": "#d62728",
}
WASTE_RED: Final = COLOURS["restart_waste_cost"]
SEGMENTS: Final = tuple(COLOURS)
_TITLES: Final = {
    "cost_reserved": "reserved",
    "cost_capacity_block": "capacity block",
    "cost_on_demand": "on-demand",
    "cost_spot": "spot",
    "reserved_idle_cost": "reserved idle",
    "unallocated_cost": "unallocated",
    "restart_waste_cost": "restart waste",
}


def _round(name: str, value: float | int | None) -> float | int | None:
    if value is None or name in COUNTS:
        return value
    if name in MONEY:
        return round(float(value), 2)
    return round(float(value), 6)


def total(groups: Sequence[Group]) -> dict[str, float | int | None]:
    """Figures of all groups together (ratios recomputed, not summed)."""
    out: dict[str, float | int | None] = {}
    for name in COLUMNS:
        values = [g.figures[name] for g in groups if g.figures[name] is not None]
        out[name] = sum(v for v in values if v is not None) if values else None
    alloc = out["allocated_gpu_hours"] or 0
    waste = out["restart_waste_gpu_hours"] or 0
    out["waste_share"] = waste / alloc if alloc else None
    out["cost_share"] = 1.0 if out["effective_cost"] else None
    # a notice or gang can touch several groups: the total of distinct ones is not a sum
    out["notices"] = out["gangs_hit"] = None
    return out


def as_json(
    groups: Sequence[Group], window: Window, by: str, *, idle: Sequence[Idle] | None = None
) -> str:
    doc: dict[str, Any] = {
        "by": by,
        "window": {
            "since": _iso(window.since),
            "until": _iso(window.until),
            "metered_to": _iso(window.metered_to),
        },
        "currency": "USD",
        "groups": [{by: g.key, **{k: _round(k, v) for k, v in g.figures.items()}} for g in groups],
        "total": {k: _round(k, v) for k, v in total(groups).items()},
        "spot_pays": spotpays.as_json(groups, by),
    }
    if idle is not None:
        doc["idle"] = [
            {
                "group": i.group,
                "hour": _iso(i.hour),
                "instance": i.instance,
                "purchase_option": i.purchase_option,
                "gpu_hours": round(i.gpu_hours, 6),
                "cost": round(i.cost, 2),
            }
            for i in idle
        ]
    return json.dumps(doc, indent=2)


def _iso(t: Any) -> str | None:
    return t.isoformat(timespec="seconds") + "Z" if t is not None else None


def as_csv(groups: Sequence[Group], by: str) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([by, *COLUMNS])
    for g in groups:
        w.writerow([g.key, *("" if (v := _round(k, g.figures[k])) is None else v for k in COLUMNS)])
    return buf.getvalue()


TABLE: Final = (
    ("GPU-h", "allocated_gpu_hours", "h"),
    ("cost", "allocated_cost", "$"),
    ("spot $", "cost_spot", "$"),
    ("od $", "cost_on_demand", "$"),
    ("rsv $", "cost_reserved", "$"),
    ("idle $", "reserved_idle_cost", "$"),
    ("unalloc $", "unallocated_cost", "$"),
    ("waste GPU-h", "restart_waste_gpu_hours", "h"),
    ("waste $", "restart_waste_cost", "$"),
    ("overhead GPU-h", "restart_overhead_gpu_hours", "h"),
    ("overhead $", "restart_overhead_cost", "$"),
    ("waste %", "waste_share", "%"),
    ("effective $", "effective_cost", "$"),
    ("share", "cost_share", "%"),
    ("spot net savings $", "spot_net_savings", "$"),
    ("notices", "notices", "n"),
    ("gangs", "gangs_hit", "n"),
    ("ckpt ok/partial/none", "checkpointed", "o"),
    ("missed", "deadline_misses", "n"),
)


def _cell(kind: str, figures: dict[str, float | int | None], name: str) -> str:
    if kind == "o":
        f = figures
        none = sum(int(f[k] or 0) for k in ("not_durable", "no_ack", "not_opted_in"))
        return f"{int(f['checkpointed'] or 0)}/{int(f['partial'] or 0)}/{none}"
    value = figures[name]
    if value is None:
        return "-"
    if kind == "$":
        return f"{value:,.2f}"
    if kind == "%":
        return f"{100 * value:.2f}%"
    if kind == "n":
        return str(int(value))
    return f"{value:,.2f}"


IDLE_HEAD: Final = ("group", "hour", "instance", "option", "GPU-h", "cost $")


def _idle_rows(idle: Sequence[Idle]) -> list[list[str]]:
    return [
        [
            i.group,
            _iso(i.hour) or "",
            i.instance,
            i.purchase_option or "-",
            f"{i.gpu_hours:,.2f}",
            f"{i.cost:,.2f}",
        ]
        for i in idle
    ]


def _aligned(rows: Sequence[Sequence[str]], right_from: int) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            c.rjust(w) if i >= right_from else c.ljust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ).rstrip()
        for r in rows
    ]


def as_table(groups: Sequence[Group], by: str, *, idle: Sequence[Idle] | None = None) -> str:
    head = [by, *(t for t, _, _ in TABLE)]
    rows = [[g.key, *(_cell(k, g.figures, n) for _, n, k in TABLE)] for g in groups]
    tot = total(groups)
    rows.append(["TOTAL", *(_cell(k, tot, n) for _, n, k in TABLE)])
    widths = [max(len(r[i]) for r in (head, *rows)) for i in range(len(head))]

    def line(r: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ).rstrip()

    out = [line(head), line(["-" * w for w in widths])]
    out += [line(r) for r in rows[:-1]]
    out += [line(["-" * w for w in widths]), line(rows[-1])]
    unpriced = tot["unpriced_gpu_hours"] or 0
    if unpriced:
        out.append(f"unpriced: {unpriced:,.2f} GPU-h had no bill row and no rate")
    out += spotpays.as_table(groups, by)
    if idle is not None:
        out += ["", "idle GPUs by hour and instance:"]
        out += _aligned([list(IDLE_HEAD), *_idle_rows(idle)], right_from=4)
    return "\n".join(out) + "\n"


def as_html(
    groups: Sequence[Group], window: Window, by: str, *, idle: Sequence[Idle] | None = None
) -> str:
    """One page, no scripts, no external references: per group a stacked bar, then the table."""
    width, bar_h, gap, left, right = 1100, 34, 14, 170, 150
    stacks = [(g, [(s, max(0.0, float(g.figures[s] or 0))) for s in SEGMENTS]) for g in groups]
    peak = max((sum(v for _, v in segs) for _, segs in stacks), default=0.0) or 1.0
    scale = (width - left - right) / peak
    svg_h = 40 + len(stacks) * (bar_h + gap) + 40
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{svg_h}"'
        f' role="img" aria-label="cost by purchase option with restart waste on top">'
    ]
    for i, (g, segs) in enumerate(stacks):
        y = 30 + i * (bar_h + gap)
        parts.append(
            f'<text x="{left - 10}" y="{y + bar_h / 2 + 5}" text-anchor="end"'
            f' font-size="14">{escape(g.key)}</text>'
        )
        x = float(left)
        for name, value in segs:
            w = value * scale
            if w <= 0:
                continue
            parts.append(
                f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{bar_h}"'
                f' fill="{COLOURS[name]}"><title>{_TITLES[name]}: ${value:,.2f}</title></rect>'
            )
            x += w
        parts.append(
            f'<text x="{x + 8:.1f}" y="{y + bar_h / 2 + 5}" font-size="13">'
            f"${sum(v for _, v in segs):,.2f}</text>"
        )
    ly = 30 + len(stacks) * (bar_h + gap) + 10
    lx = left
    for name in SEGMENTS:
        parts.append(
            f'<rect x="{lx}" y="{ly}" width="14" height="14" fill="{COLOURS[name]}"/>'
            f'<text x="{lx + 20}" y="{ly + 12}" font-size="13">{_TITLES[name]}</text>'
        )
        lx += 40 + 8 * len(_TITLES[name])
    parts.append("</svg>")
    head = "".join(f"<th>{escape(t)}</th>" for t in (by, *(t for t, _, _ in TABLE)))
    body = "".join(
        "<tr>"
        + f"<td>{escape(g.key)}</td>"
        + "".join(f"<td>{escape(_cell(k, g.figures, n))}</td>" for _, n, k in TABLE)
        + "</tr>"
        for g in groups
    )
    tot = total(groups)
    body += (
        '<tr class="total"><td>TOTAL</td>'
        + "".join(f"<td>{escape(_cell(k, tot, n))}</td>" for _, n, k in TABLE)
        + "</tr>"
    )
    style = (
        "body{font-family:sans-serif;margin:24px;color:#222;background:#fff}"
        "table{border-collapse:collapse;margin-top:16px}"
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right;font-size:13px}"
        "td:first-child,th:first-child{text-align:left}"
        "tr.total td{font-weight:bold}"
        f"tr.loss td{{background:{spotpays.LOSS_BAND}}}"
    )
    return (
        '<!doctype html>\n<html><head><meta charset="utf-8">'
        f"<title>reclaimd report by {escape(by)}</title><style>{style}</style></head><body>"
        f"<h1>GPU cost and restart waste by {escape(by)}</h1>"
        f"<p>{escape(window.describe())}, USD. Bars: cost by purchase option,"
        " restart waste on top (the effective cost). Restart overhead (GPUs held while a"
        " replacement gang restores) is part of the cost bars: the table shows it, not the"
        " bars.</p>"
        + "".join(parts)
        + f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        + spotpays.as_html(groups, by)
        + (_idle_html(idle) if idle is not None else "")
        + "</body></html>\n"
    )


def _idle_html(idle: Sequence[Idle]) -> str:
    head = "".join(f"<th>{escape(t)}</th>" for t in IDLE_HEAD)
    body = "".join(
        "<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in _idle_rows(idle)
    )
    return (
        "<h2>Idle GPUs by hour and instance</h2>"
        f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    )
