"""``reclaimd report``: what each tenant's GPUs and restart waste cost, joined with the bill.

Inputs: the ledger (restart-waste, restart-overhead and allocation rows; JSON-lines files or
Kafka topics), a FOCUS cost-and-usage export (CSV or Parquet) and/or a rates file. The join
is ``report.sql`` run in embedded DuckDB (``engine``); the same file runs in Athena or
BigQuery (docs/ledger.md). Bad input is one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from reclaimd.kafkaconn import KafkaSettings
from reclaimd.ledger.labels import DEFAULT_ALLOW, LabelPolicy
from reclaimd.model import ParseError, parse_time
from reclaimd.report import engine, ledger_input, render
from reclaimd.report.engine import Group, Idle, Window
from reclaimd.report.ledger_input import InputError

__all__ = ["Group", "Idle", "InputError", "Report", "Window", "add_parser", "build", "cmd_report"]
DETAIL_FORMATS = ("table", "json", "html")  # CSV is one row per group, nothing else


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
    s.add_argument(
        "--config",
        type=Path,
        help="reclaimd's settings file: its kafka section (TLS, SASL, MSK IAM) reaches a"
        " kafka:// ledger as the replicas do (RECLAIMD_KAFKA__* overrides apply)",
    )
    s.add_argument("--focus", type=Path, help="FOCUS cost-and-usage export (.csv or .parquet)")
    s.add_argument("--rates", type=Path, help="CSV sku,purchase_option,usd_per_gpu_hour")
    s.add_argument("--since", type=_when, help="window start (RFC 3339 or YYYY-MM-DD), inclusive")
    s.add_argument("--until", type=_when, help="window end, exclusive")
    s.add_argument("--by", default="tenant", choices=DEFAULT_ALLOW)
    s.add_argument("--format", default="table", choices=["table", "json", "csv", "html"])
    s.add_argument(
        "--detail",
        action="store_true",
        help="also list each instance-hour behind reserved-idle and unallocated (instance ids;"
        " table, json, html)",
    )
    s.add_argument("-o", "--output", type=Path, help="write here instead of stdout")
    s.set_defaults(func=cmd_report)


@dataclass(frozen=True)
class Report:
    groups: list[Group]
    window: Window  # the window the groups cover (open bounds closed on the ledger's hours)
    idle: list[Idle] = field(default_factory=list)  # with detail only


def build(
    sources: list[str],
    *,
    by: str,
    focus: Path | None,
    rates: Path | None,
    window: Window,
) -> list[Group]:
    return build_report(sources, by=by, focus=focus, rates=rates, window=window).groups


def build_report(
    sources: list[str],
    *,
    by: str,
    focus: Path | None,
    rates: Path | None,
    window: Window,
    detail: bool = False,
    connection: KafkaSettings | None = None,
) -> Report:
    """The groups, the window they cover (an open bound is the ledger's own first hour or the
    end of its last: a report states its window, and prices no bill hour outside the hours
    its ledger covers) and, with ``detail``, the idle instance-hours."""
    if focus is None and rates is None:
        raise InputError("give a FOCUS export (--focus), a rates file (--rates), or both")
    if window.since and window.until and window.since >= window.until:
        raise InputError("--since must be before --until")
    ledger = ledger_input.read(sources, window.since, LabelPolicy(), connection)
    rate_rows = engine.read_rates(rates) if rates is not None else []
    window = _span(ledger, window)
    groups, idle = engine.report_with_idle(
        ledger, by=by, focus=focus, rates=rate_rows, window=window, detail=detail
    )
    return Report(groups=groups, window=window, idle=idle)


def _span(ledger: ledger_input.Ledger, window: Window) -> Window:
    hours = [a.hour_start for a in ledger.allocation if window.holds(a.hour_start)]
    stops = [w.stopped_at for w in ledger.waste if window.holds(w.stopped_at)]
    stops += [o.restarted_at for o in ledger.overhead if window.holds(o.restarted_at)]
    firsts = hours + [t.replace(minute=0, second=0, microsecond=0) for t in stops]
    lasts = [h + timedelta(hours=1) for h in firsts]
    open_to = ledger.open_until
    return Window(
        since=window.since or (min(firsts) if firsts else None),
        until=window.until or (max(lasts) if lasts else None),
        metered_to=open_to if open_to is not None and window.holds(open_to) else None,
    )


def render_as(fmt: str, rep: Report, by: str, *, detail: bool = False) -> str:
    idle = rep.idle if detail else None
    if fmt == "json":
        return render.as_json(rep.groups, rep.window, by, idle=idle) + "\n"
    if fmt == "csv":
        return render.as_csv(rep.groups, by)
    if fmt == "html":
        return render.as_html(rep.groups, rep.window, by, idle=idle)
    return render.as_table(rep.groups, by, idle=idle)


def cmd_report(args: argparse.Namespace) -> int:
    window = Window(
        since=args.since.replace(tzinfo=None) if args.since else None,
        until=args.until.replace(tzinfo=None) if args.until else None,
    )
    try:
        if args.detail and args.format not in DETAIL_FORMATS:
            raise InputError(f"--detail is shown with --format {', '.join(DETAIL_FORMATS)}")
        rep = build_report(
            args.ledger,
            by=args.by,
            focus=args.focus,
            rates=args.rates,
            window=window,
            detail=args.detail,
            connection=ledger_input.connection_of(args.config),
        )
        text = render_as(args.format, rep, args.by, detail=args.detail)
        if args.output is not None:
            args.output.write_text(text)
        else:
            sys.stdout.write(text)
    except (InputError, OSError) as e:
        print(f"reclaimd report: {e}", file=sys.stderr)
        return 2
    return 0
