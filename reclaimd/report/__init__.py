"""``reclaimd report``: what each tenant's GPUs and restart waste cost, joined with the bill.

Inputs: the ledger (restart-waste and allocation rows; JSON-lines files or Kafka topics), a
FOCUS cost-and-usage export (CSV or Parquet) and/or a rates file. The join is ``report.sql``
run in embedded DuckDB (``engine``); the same file runs in Athena or BigQuery (docs/ledger.md).
Bad input is one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from reclaimd.ledger import DEFAULT_ALLOW, LabelPolicy
from reclaimd.model import ParseError, parse_time
from reclaimd.report import engine, ledger_input, render
from reclaimd.report.engine import Group, Window
from reclaimd.report.ledger_input import InputError

__all__ = ["Group", "InputError", "Window", "add_parser", "build", "cmd_report"]


def _when(value: str) -> datetime:
    try:
        return parse_time(value if "T" in value or " " in value else value + "T00:00:00Z")
    except ParseError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def add_parser(sub: Any) -> None:
    s = sub.add_parser(
        "report", help="cost of allocation and restart waste per tenant (FOCUS join in DuckDB)"
    )
    s.add_argument(
        "--ledger",
        action="append",
        required=True,
        metavar="SRC",
        help="JSON-lines export or kafka://host:port/topic (repeat for the allocation topic)",
    )
    s.add_argument("--focus", type=Path, help="FOCUS cost-and-usage export (.csv or .parquet)")
    s.add_argument("--rates", type=Path, help="CSV sku,purchase_option,usd_per_gpu_hour")
    s.add_argument("--since", type=_when, help="window start (RFC 3339 or YYYY-MM-DD), inclusive")
    s.add_argument("--until", type=_when, help="window end, exclusive")
    s.add_argument("--by", default="tenant", choices=DEFAULT_ALLOW)
    s.add_argument("--format", default="table", choices=["table", "json", "csv", "html"])
    s.add_argument("-o", "--output", type=Path, help="write here instead of stdout")
    s.set_defaults(func=cmd_report)


def build(
    sources: list[str],
    *,
    by: str,
    focus: Path | None,
    rates: Path | None,
    window: Window,
) -> list[Group]:
    return build_with_window(sources, by=by, focus=focus, rates=rates, window=window)[0]


def build_with_window(
    sources: list[str],
    *,
    by: str,
    focus: Path | None,
    rates: Path | None,
    window: Window,
) -> tuple[list[Group], Window]:
    """The groups, and the window they cover: an open bound is the ledger's own first hour
    or the end of its last (a report states its window, and prices no bill hour outside
    the hours its ledger covers)."""
    if focus is None and rates is None:
        raise InputError("give a FOCUS export (--focus), a rates file (--rates), or both")
    if window.since and window.until and window.since >= window.until:
        raise InputError("--since must be before --until")
    ledger = ledger_input.read(sources, window.since, LabelPolicy())
    rate_rows = engine.read_rates(rates) if rates is not None else []
    window = _span(ledger, window)
    groups = engine.report(ledger, by=by, focus=focus, rates=rate_rows, window=window)
    return groups, window


def _span(ledger: ledger_input.Ledger, window: Window) -> Window:
    hours = [a.hour_start for a in ledger.allocation if window.holds(a.hour_start)]
    stops = [w.stopped_at for w in ledger.waste if window.holds(w.stopped_at)]
    firsts = hours + [t.replace(minute=0, second=0, microsecond=0) for t in stops]
    lasts = [h + timedelta(hours=1) for h in firsts]
    open_to = ledger.open_until
    return Window(
        since=window.since or (min(firsts) if firsts else None),
        until=window.until or (max(lasts) if lasts else None),
        metered_to=open_to if open_to is not None and window.holds(open_to) else None,
    )


def render_as(fmt: str, groups: list[Group], window: Window, by: str) -> str:
    if fmt == "json":
        return render.as_json(groups, window, by) + "\n"
    if fmt == "csv":
        return render.as_csv(groups, by)
    if fmt == "html":
        return render.as_html(groups, window, by)
    return render.as_table(groups, by)


def cmd_report(args: argparse.Namespace) -> int:
    window = Window(
        since=args.since.replace(tzinfo=None) if args.since else None,
        until=args.until.replace(tzinfo=None) if args.until else None,
    )
    try:
        groups, window = build_with_window(
            args.ledger, by=args.by, focus=args.focus, rates=args.rates, window=window
        )
        text = render_as(args.format, groups, window, args.by)
        if args.output is not None:
            args.output.write_text(text)
        else:
            sys.stdout.write(text)
    except (InputError, OSError) as e:
        print(f"reclaimd report: {e}", file=sys.stderr)
        return 2
    return 0
