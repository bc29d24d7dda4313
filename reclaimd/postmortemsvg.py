"""A notice's post-mortem timeline (``postmortem.Timeline``) drawn as a picture.

``render_svg`` and ``render_html`` draw what ``postmortem.render_text`` writes for a terminal
as a self-contained picture (no script, no external resource): the overview on the deadline's
scale, the zoomed timeline on the handling's, bars per step, the deadline as a red line,
misses in red, failures in amber.
"""

from __future__ import annotations

import html

from reclaimd.postmortem import (
    NO_GANG,
    NOTICE_SECTION,
    Row,
    Scale,
    Timeline,
    secs,
    summary,
    tick,
    window_scale,
    zoom_scale,
)

_STEP_COLOURS = {
    "claim": "#6c8ebf",
    "resolve": "#82b366",
    "cordon": "#9673a6",
    "checkpoint": "#3a7ca5",
    "checkpoint.rank": "#5aa9e6",
    "drain": "#7f8c8d",
    "evict": "#95a5a6",
    "ledger": "#d6b656",
}
MISS_RED = "#d62728"
FAIL_AMBER = "#f0a30a"
DEADLINE_RED = "#c0392b"
_W, _LABEL_W, _ROW_H, _PAD = 1360, 330, 22, 16


def _colour(t: Timeline, r: Row) -> str:
    if t.missed(r):
        return MISS_RED
    if not r.ok:
        return FAIL_AMBER
    return _STEP_COLOURS.get(r.step, "#7f8c8d")


def render_svg(t: Timeline) -> str:
    """The timeline as one self-contained SVG document."""
    e = html.escape
    plot_w = _W - _LABEL_W - 2 * _PAD - 280  # room on the right for the result text
    x0 = _PAD + _LABEL_W
    parts: list[str] = []
    y = _PAD + 18.0
    for i, line in enumerate(summary(t)):
        weight = ' font-weight="bold" font-size="16"' if i == 0 else ""
        parts.append(f'<text x="{_PAD}" y="{y}"{weight}>{e(line)}</text>')
        y += 20

    if t.window_s is not None:
        overview, y = _svg_overview(t, t.window_s, x0=x0, y=y + 10.0, plot_w=plot_w)
        parts.extend(overview)

    # Zoomed timeline.
    zs = zoom_scale(t, plot_w)
    title = f"timeline, 0 to {secs(zs.hi)} after receipt"
    parts.append(f'<text x="{_PAD}" y="{y + 14}" font-weight="bold">{e(title)}</text>')
    y += 24
    top = y
    body: list[str] = []
    for section, rows in t.sections():
        if section != NOTICE_SECTION:
            label = f"gang {section}" if section != NO_GANG else NO_GANG
            body.append(
                f'<text x="{_PAD}" y="{y + 15}" font-weight="bold" fill="#2c3e50">{e(label)}</text>'
            )
            y += _ROW_H
        for r in rows:
            body.append(_svg_row(t, r, zs, x0, y))
            y += _ROW_H
    bottom = y
    grid = [
        f'<line x1="{x0 + zs.x(tk):.1f}" y1="{top}" x2="{x0 + zs.x(tk):.1f}" y2="{bottom}"'
        ' stroke="#ecf0f1"/>'
        for tk in zs.ticks
    ]
    parts.extend(grid)
    parts.extend(body)
    parts.extend(_axis(zs, x0, bottom + 2))
    if zs.deadline is not None:
        dx = x0 + zs.x(zs.deadline)
        parts.append(_deadline_line(dx, top - 6, bottom, f"deadline +{secs(zs.deadline)}"))
    elif t.window_s is not None:
        ax = x0 + plot_w
        parts.append(
            f'<text class="deadline-off-scale" x="{ax:.1f}" y="{top - 8}" text-anchor="end"'
            f' fill="{DEADLINE_RED}">deadline at +{e(secs(t.window_s))} (off this scale)'
            " &#8594;</text>"
        )
    y = bottom + 40
    parts.extend(_legend(y))
    height = y + 30
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{height}"'
        f' viewBox="0 0 {_W} {height}" font-family="DejaVu Sans, Arial, sans-serif"'
        ' font-size="12">'
        f'<rect width="{_W}" height="{height}" fill="white"/>' + "".join(parts) + "</svg>\n"
    )


def _svg_overview(
    t: Timeline, window: float, *, x0: float, y: float, plot_w: float
) -> tuple[list[str], float]:
    """The whole window on the deadline's scale, and where the next part starts."""
    e = html.escape
    parts: list[str] = []
    ws = window_scale(t, plot_w)
    parts.append(f'<text x="{_PAD}" y="{y + 15}" font-weight="bold">whole window</text>')
    parts.append(
        f'<rect x="{x0}" y="{y}" width="{plot_w}" height="20" fill="#f4f6f7" stroke="#bdc3c7"/>'
    )
    # The handling, blue up to the deadline and red past it.
    hx0, hx1 = x0 + ws.x(0.0), x0 + ws.x(min(t.total_s, window))
    parts.append(
        f'<rect class="handling" x="{hx0:.1f}" y="{y + 2}" width="{max(hx1 - hx0, 2):.1f}"'
        f' height="16" fill="#3a7ca5"><title>handling: {e(secs(t.total_s))}</title></rect>'
    )
    if t.total_s > window:
        lx = x0 + ws.x(t.total_s)
        parts.append(
            f'<rect class="handling late" x="{hx1:.1f}" y="{y + 2}" width="{lx - hx1:.1f}"'
            f' height="16" fill="{MISS_RED}"><title>past the deadline:'
            f" {e(secs(t.total_s - window))}</title></rect>"
        )
    if ws.lo < 0:
        parts.append(
            f'<rect x="{x0}" y="{y + 6}" width="{max(hx0 - x0, 1):.1f}" height="8"'
            ' fill="#bdc3c7"><title>between the provider&apos;s notice and receipt</title>'
            "</rect>"
        )
    dx = x0 + ws.x(window)
    parts.append(_deadline_line(dx, y - 4, y + 24, f"deadline +{secs(window)}"))
    y += 24
    parts.extend(_axis(ws, x0, y))
    return parts, y + 30


def _svg_row(t: Timeline, r: Row, zs: Scale, x0: float, y: float) -> str:
    e = html.escape
    indent = _PAD + (16 if r.section != NOTICE_SECTION else 0)
    subject = r.subject + (f" @ {r.node}" if r.node and r.node != r.subject else "")
    label = f"{r.label}  {subject}".strip()
    bx0, bx1 = x0 + zs.x(r.start_s), x0 + zs.x(r.end_s)
    colour = _colour(t, r)
    cls = "miss" if t.missed(r) else ("fail" if not r.ok else "ok")
    left = t.left_s(r)
    tip = f"{r.step} {subject}: {r.start_s:.3f} s -> {r.end_s:.3f} s" + (
        f", {left:.2f} s left" if left is not None else ""
    )
    result = r.detail or ("ok" if r.ok else "failed")
    if t.missed(r):
        result = f"MISS {r.detail}".strip()
    if left is not None:
        result += f" ({secs(abs(left))} {'left' if left >= 0 else 'late'})"
    return (
        f'<text x="{indent}" y="{y + 15}">{e(label[:60])}</text>'
        f'<rect class="bar {cls}" data-step="{e(r.step)}" x="{bx0:.1f}" y="{y + 4}"'
        f' width="{max(bx1 - bx0, 2):.1f}" height="{_ROW_H - 8}" rx="2" fill="{colour}">'
        f"<title>{e(tip)}</title></rect>"
        f'<text x="{x0 + zs.width + 8:.1f}" y="{y + 15}" fill="#555">{e(result[:48])}</text>'
    )


def _deadline_line(x: float, y0: float, y1: float, label: str) -> str:
    return (
        f'<line class="deadline" x1="{x:.1f}" y1="{y0:.1f}" x2="{x:.1f}" y2="{y1:.1f}"'
        f' stroke="{DEADLINE_RED}" stroke-width="2" stroke-dasharray="6 3"/>'
        f'<text x="{x - 4:.1f}" y="{y0 - 2:.1f}" text-anchor="end" fill="{DEADLINE_RED}">'
        f"{html.escape(label)}</text>"
    )


def _axis(s: Scale, x0: float, y: float) -> list[str]:
    out = [f'<line x1="{x0}" y1="{y}" x2="{x0 + s.width}" y2="{y}" stroke="#7f8c8d"/>']
    for tk in s.ticks:
        x = x0 + s.x(tk)
        out.append(f'<line x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{y + 4}" stroke="#7f8c8d"/>')
        out.append(
            f'<text x="{x:.1f}" y="{y + 16}" text-anchor="middle" fill="#555">'
            f"{html.escape(tick(tk))}</text>"
        )
    return out


def _legend(y: float) -> list[str]:
    items = [(c, s) for s, c in _STEP_COLOURS.items()] + [
        (FAIL_AMBER, "failed (no ack, eviction blocked)"),
        (MISS_RED, "ended after the deadline"),
    ]
    out, x = [], float(_PAD)
    for colour, name in items:
        out.append(f'<rect x="{x:.0f}" y="{y}" width="12" height="12" fill="{colour}"/>')
        out.append(f'<text x="{x + 16:.0f}" y="{y + 11}">{html.escape(name)}</text>')
        x += 30 + 6.6 * len(name)
    return out


def render_html(t: Timeline) -> str:
    """A self-contained page: the picture and the rows as a table."""
    e = html.escape
    rows = []
    for section, rs in t.sections():
        if section != NOTICE_SECTION:
            head = f"gang {section}" if section != NO_GANG else NO_GANG
            rows.append(f'<tr class="section"><td colspan="7">{e(head)}</td></tr>')
        for r in rs:
            left = t.left_s(r)
            mark = "MISS" if t.missed(r) else ("ok" if r.ok else "FAIL")
            rows.append(
                f'<tr class="{mark.lower()}"><td>{e(r.label)}</td><td>{e(r.subject)}</td>'
                f"<td>{e(r.node)}</td><td>{r.start_s:.3f}</td><td>{r.end_s:.3f}</td>"
                f"<td>{'' if left is None else f'{left:.2f}'}</td>"
                f"<td>{e(mark)} {e(r.detail)}</td></tr>"
            )
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>reclaimd post-mortem {e(t.notice_id)}</title><style>"
        "body{font-family:'DejaVu Sans',Arial,sans-serif;margin:16px;color:#2c3e50}"
        "table{border-collapse:collapse;margin-top:12px;font-size:12px}"
        "td,th{border-bottom:1px solid #ecf0f1;padding:2px 10px;text-align:left}"
        "tr.section td{font-weight:bold;padding-top:8px}"
        f"tr.miss td{{color:{MISS_RED};font-weight:bold}}tr.fail td{{color:#b9770e}}"
        "</style></head><body>\n"
        + render_svg(t)
        + "<table><tr><th>step</th><th>subject</th><th>node</th><th>start s</th>"
        "<th>end s</th><th>left s</th><th>result</th></tr>"
        + "".join(rows)
        + "</table></body></html>\n"
    )
