"""Does spot pay? Per group: what its spot GPU-hours saved against on-demand once the restarts
they caused are paid, and the restart-waste share at which that saving would be gone.

The sums come from report.sql (any engine: ``spot_on_demand_cost``, ``cost_spot``,
``spot_waste_*``, ``spot_overhead_*``, ``spot_net_savings``); this module derives the rest
and draws it. Definitions (docs/ledger.md, "Does spot pay?"):

* on-demand cost: the spot GPU-hours at the on-demand rate of the same SKU (the rates file's
  ``on_demand`` line, else the bill's Standard rows of the SKU, else the hour's ListCost);
* restart waste on spot: progress lost on spot ranks, at the rate it was lost at (it is
  computed again, as ``effective_cost`` counts it);
* restart overhead on spot: GPU-hours a replacement held on spot while restoring, at the
  on-demand rate: their spot cost is in the spot cost already, and an on-demand run would not
  have held them, so they take their on-demand price off the saving;
* net saving = on-demand cost - spot cost - waste - overhead (``spot_net_savings``);
* break-even waste share: the spot waste share (waste GPU-hours / spot GPU-hours) at which the
  net saving is 0, the waste priced at the group's own waste rate (its spot rate when it lost
  nothing); 0 when spot did not pay even without waste.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from typing import Any, Final

from reclaimd.report.engine import Group

# The picture's colours (the Chromium tests look for them): spot and waste a lighter shade of
# the cost picture's, so that a screenshot tells the two pictures apart
ON_DEMAND_GREY: Final = "#aab7c4"
SPOT_GREEN: Final = "#82e0aa"
WASTE_RED: Final = "#f1948a"
OVERHEAD_AMBER: Final = "#f39c12"
LOSS_BAND: Final = "#f9d6d5"  # behind a group where spot did not pay
LOSS_TEXT: Final = "#b03a2e"
SAVED_TEXT: Final = "#1e8449"


@dataclass(frozen=True)
class SpotPays:
    key: str
    gpu_hours: float
    on_demand_cost: float
    cost: float
    waste_gpu_hours: float
    waste_cost: float
    overhead_gpu_hours: float
    overhead_cost: float

    @property
    def net_saving(self) -> float:
        return self.on_demand_cost - self.cost - self.waste_cost - self.overhead_cost

    @property
    def pays(self) -> bool:
        return self.net_saving >= 0

    @property
    def waste_share(self) -> float:
        return self.waste_gpu_hours / self.gpu_hours

    @property
    def break_even_waste_share(self) -> float | None:
        """Where ``net_saving`` reaches 0 as the waste grows at its own rate (None: no rate)."""
        if self.waste_gpu_hours > 0:
            rate = self.waste_cost / self.waste_gpu_hours
        else:
            rate = self.cost / self.gpu_hours
        if rate <= 0:
            return None
        headroom = self.on_demand_cost - self.cost - self.overhead_cost
        return max(0.0, headroom) / (self.gpu_hours * rate)


def _f(figures: dict[str, float | int | None], name: str) -> float:
    return float(figures.get(name) or 0)


def of(groups: Sequence[Group]) -> list[SpotPays]:
    """The groups with spot GPU-hours (idle groups and on-demand-only ones have none)."""
    out = []
    for g in groups:
        f = g.figures
        if _f(f, "gpu_hours_spot") <= 0:
            continue
        out.append(
            SpotPays(
                key=g.key,
                gpu_hours=_f(f, "gpu_hours_spot"),
                on_demand_cost=_f(f, "spot_on_demand_cost"),
                cost=_f(f, "cost_spot"),
                waste_gpu_hours=_f(f, "spot_waste_gpu_hours"),
                waste_cost=_f(f, "spot_waste_cost"),
                overhead_gpu_hours=_f(f, "spot_overhead_gpu_hours"),
                overhead_cost=_f(f, "spot_overhead_cost"),
            )
        )
    return out


def total(rows: Sequence[SpotPays]) -> SpotPays | None:
    if not rows:
        return None

    def add(name: str) -> float:
        return float(sum(getattr(r, name) for r in rows))

    return SpotPays(
        "TOTAL",
        gpu_hours=add("gpu_hours"),
        on_demand_cost=add("on_demand_cost"),
        cost=add("cost"),
        waste_gpu_hours=add("waste_gpu_hours"),
        waste_cost=add("waste_cost"),
        overhead_gpu_hours=add("overhead_gpu_hours"),
        overhead_cost=add("overhead_cost"),
    )


def as_dict(r: SpotPays, by: str) -> dict[str, Any]:
    """JSON: money to the cent, hours and shares to six places (as the groups)."""
    even = r.break_even_waste_share
    return {
        by: r.key,
        "spot_gpu_hours": round(r.gpu_hours, 6),
        "on_demand_cost": round(r.on_demand_cost, 2),
        "spot_cost": round(r.cost, 2),
        "waste_gpu_hours": round(r.waste_gpu_hours, 6),
        "waste_cost": round(r.waste_cost, 2),
        "overhead_gpu_hours": round(r.overhead_gpu_hours, 6),
        "overhead_cost": round(r.overhead_cost, 2),
        "net_saving": round(r.net_saving, 2),
        "waste_share": round(r.waste_share, 6),
        "break_even_waste_share": None if even is None else round(even, 6),
        "pays": r.pays,
    }


def as_json(groups: Sequence[Group], by: str) -> dict[str, Any]:
    rows = of(groups)
    tot = total(rows)
    return {
        "groups": [as_dict(r, by) for r in rows],
        "total": None if tot is None else as_dict(tot, by),
    }


HEAD: Final = (
    "spot GPU-h", "on-demand $", "spot $", "waste GPU-h", "waste $", "overhead GPU-h",
    "overhead $", "net saving $", "waste %", "break-even %", "pays",
)  # fmt: skip
NOT_PAID: Final = "NO"  # the table's mark of a group where spot did not pay


def cells(r: SpotPays) -> list[str]:
    even = r.break_even_waste_share
    return [
        f"{r.gpu_hours:,.2f}",
        f"{r.on_demand_cost:,.2f}",
        f"{r.cost:,.2f}",
        f"{r.waste_gpu_hours:,.2f}",
        f"{r.waste_cost:,.2f}",
        f"{r.overhead_gpu_hours:,.2f}",
        f"{r.overhead_cost:,.2f}",
        f"{r.net_saving:,.2f}",
        f"{100 * r.waste_share:.2f}%",
        "-" if even is None else f"{100 * even:.2f}%",
        "yes" if r.pays else NOT_PAID,
    ]


def as_table(groups: Sequence[Group], by: str) -> list[str]:
    """The section under the groups' table (no lines when no group ran on spot)."""
    rows = of(groups)
    tot = total(rows)
    if tot is None:
        return []
    body = [[r.key, *cells(r)] for r in rows]
    table = [[by, *HEAD], *body, ["TOTAL", *cells(tot)]]
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]

    def line(r: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ).rstrip()

    rule = line(["-" * w for w in widths])
    return [
        "",
        "does spot pay? spot GPU-hours at on-demand prices against what they cost, restart"
        " waste (at its rate) and restart overhead (at on-demand) on spot:",
        line(table[0]),
        rule,
        *(line(r) for r in table[1:-1]),
        rule,
        line(table[-1]),
    ]


def as_html(groups: Sequence[Group], by: str) -> str:
    """A heading, a picture (per group: its on-demand cost beside spot cost + waste +
    overhead; a group where spot did not pay on a red band) and the table."""
    rows = of(groups)
    if not rows:
        return ""
    width, bar_h, gap, left = 1100, 14, 16, 170
    peak = max(max(r.on_demand_cost, r.cost + r.waste_cost + r.overhead_cost) for r in rows)
    scale = (width - left - 190) / (peak or 1.0)
    height = 20 + len(rows) * (2 * bar_h + 2 + gap) + 30
    svg = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}"'
        ' role="img" aria-label="on-demand cost against spot cost, waste and overhead">'
    ]
    for i, r in enumerate(rows):
        y = 10 + i * (2 * bar_h + 2 + gap)
        if not r.pays:
            svg.append(
                f'<rect x="0" y="{y - 5}" width="{width}" height="{2 * bar_h + 12}"'
                f' fill="{LOSS_BAND}"/>'
            )
        svg.append(
            f'<text x="{left - 10}" y="{y + bar_h + 5}" text-anchor="end"'
            f' font-size="14">{escape(r.key)}</text>'
        )
        svg.append(_bar(left, y, [(ON_DEMAND_GREY, r.on_demand_cost, "on-demand")], scale))
        stack = [(SPOT_GREEN, r.cost, "spot"), (WASTE_RED, r.waste_cost, "restart waste")]
        stack.append((OVERHEAD_AMBER, r.overhead_cost, "restart overhead (at on-demand)"))
        svg.append(_bar(left, y + bar_h + 2, stack, scale))
        end = left + scale * max(r.on_demand_cost, r.cost + r.waste_cost + r.overhead_cost)
        word, colour = ("saved", SAVED_TEXT) if r.pays else ("lost", LOSS_TEXT)
        svg.append(
            f'<text x="{end + 10:.1f}" y="{y + bar_h + 5}" font-size="13" fill="{colour}">'
            f"{word} ${abs(r.net_saving):,.2f}</text>"
        )
    ly = 10 + len(rows) * (2 * bar_h + 2 + gap) + 4
    lx = left
    for colour, title in (
        (ON_DEMAND_GREY, "on-demand price"),
        (SPOT_GREEN, "spot"),
        (WASTE_RED, "restart waste"),
        (OVERHEAD_AMBER, "restart overhead"),
    ):
        svg.append(
            f'<rect x="{lx}" y="{ly}" width="14" height="14" fill="{colour}"/>'
            f'<text x="{lx + 20}" y="{ly + 12}" font-size="13">{title}</text>'
        )
        lx += 40 + 8 * len(title)
    svg.append("</svg>")
    head = "".join(f"<th>{escape(t)}</th>" for t in (by, *HEAD))
    body = "".join(
        ("<tr>" if r.pays else '<tr class="loss">')
        + "".join(f"<td>{escape(c)}</td>" for c in (r.key, *cells(r)))
        + "</tr>"
        for r in rows
    )
    tot = total(rows)
    if tot is not None:
        body += (
            '<tr class="total">'
            + "".join(f"<td>{escape(c)}</td>" for c in ("TOTAL", *cells(tot)))
            + "</tr>"
        )
    return (
        f"<h2>Does spot pay? by {escape(by)}</h2>"
        "<p>Per group, the spot GPU-hours at the on-demand price of their SKU (grey) against"
        " what they cost (green), the restart waste on spot at the rate it was lost at (red)"
        " and the restart overhead on spot at the on-demand price (amber). A group on a red"
        " band paid more on spot than on demand. Break-even: the waste share of the spot"
        " GPU-hours at which the saving is gone.</p>"
        + "".join(svg)
        + f'<table class="spot"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
    )


def _bar(x0: int, y: float, segments: Sequence[tuple[str, float, str]], scale: float) -> str:
    out, x = [], float(x0)
    for colour, value, title in segments:
        w = max(0.0, value) * scale
        if w <= 0:
            continue
        out.append(
            f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="14" fill="{colour}">'
            f"<title>{title}: ${value:,.2f}</title></rect>"
        )
        x += w
    return "".join(out)
