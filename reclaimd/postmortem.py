"""Where did the notice window go? A timeline of one notice, from its trace.

Input is a span file: reclaimd's own JSON lines (``tracing.JsonLinesExporter``) or OTLP/JSON
lines (one ``ExportTraceServiceRequest`` per line, as an OpenTelemetry Collector's file
exporter writes them), told apart line by line. A notice is found by its id (the root span's
``reclaimd.notice.id``), by its trace id, or by a ``traceparent`` (a ledger event's
``x_TraceParent``). Two passes over the file: the first finds the trace, the second keeps only
its spans, so a long-lived daemon's file is never held in memory.

Every row is one step, with its start and end in seconds after the notice was received and
what was left of the window when it ended. Rows fall in sections: the notice's own steps
(claim, resolve, cordon, checkpoint, drain, ledger), then one section per gang with each
rank's checkpoint request and each pod's eviction, with the node it ran on.

Two scales, because a notice handled in one second is invisible on a 120-second window: an
overview on the deadline's scale (how much of the window was used), and a zoomed timeline
on the handling's scale with the deadline drawn when it falls inside it, or named at the
edge when it does not. ``render_text`` writes both for a terminal; ``postmortemsvg`` draws the
same as a self-contained picture.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = "reclaimd.notice"
_ORDER = {
    "reclaimd.claim": 0,
    "reclaimd.resolve": 1,
    "reclaimd.cordon": 2,
    "reclaimd.checkpoint": 3,
    "reclaimd.checkpoint.rank": 4,
    "reclaimd.drain": 5,
    "reclaimd.evict": 6,
    "reclaimd.ledger": 7,
}
PER_POD = frozenset({"checkpoint.rank", "evict"})
NOTICE_SECTION = "notice"
NO_GANG = "pods of no known gang"
_OTLP_STATUS = {0: "UNSET", 1: "OK", 2: "ERROR"}
_OTLP_KIND = dict(
    enumerate(("UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER"))
)


class NotFound(LookupError):
    pass


@dataclass(frozen=True)
class Row:
    step: str
    subject: str  # node, pod or rank the step was about; "" for the whole notice
    start_s: float
    end_s: float
    ok: bool
    detail: str = ""
    node: str = ""
    gang: str = ""  # the gang's key for per-pod rows; "" for the notice's own steps
    rank: int | None = None

    @property
    def section(self) -> str:
        if self.step not in PER_POD:
            return NOTICE_SECTION
        return self.gang or NO_GANG

    @property
    def label(self) -> str:
        if self.step == "checkpoint.rank":
            return f"rank {self.rank}" if self.rank is not None and self.rank >= 0 else "rank ?"
        return self.step


@dataclass(frozen=True)
class Timeline:
    notice_id: str
    trace_id: str
    source: str
    kind: str
    target: str
    window_s: float | None  # deadline - received, None without deadline
    total_s: float
    rows: tuple[Row, ...]
    receipt_lag_s: float | None = None  # received - the provider's notice time
    deadline: str = ""
    met: bool | None = None  # as the runbook judged it (the root span's reclaimd.deadline_met)
    other_traces: tuple[str, ...] = ()  # earlier attempts at the same notice (a resume)

    @property
    def deadline_met(self) -> bool:
        if self.met is not None:
            return self.met
        return self.window_s is None or all(
            r.end_s <= self.window_s for r in self.rows if r.step != "checkpoint.rank"
        )

    def missed(self, row: Row) -> bool:
        return self.window_s is not None and row.end_s > self.window_s

    def left_s(self, row: Row) -> float | None:
        return None if self.window_s is None else self.window_s - row.end_s

    def sections(self) -> list[tuple[str, list[Row]]]:
        """The notice's steps first, then each gang's ranks and evictions, in start order."""
        out: dict[str, list[Row]] = {NOTICE_SECTION: []}
        for r in self.rows:
            out.setdefault(r.section, []).append(r)
        for rows in out.values():
            rows.sort(key=lambda r: (_ORDER.get("reclaimd." + r.step, 99), _rank_key(r), r.start_s))
        named = sorted(k for k in out if k not in (NOTICE_SECTION, NO_GANG))
        order = [NOTICE_SECTION, *named] + ([NO_GANG] if NO_GANG in out else [])
        return [(k, out[k]) for k in order if out[k]]


def _rank_key(r: Row) -> tuple[int, str]:
    return (r.rank if r.rank is not None and r.rank >= 0 else 1 << 30, r.subject)


# --- reading spans ------------------------------------------------------------------------


def read_spans(path: Path) -> Iterator[dict[str, Any]]:
    """Spans from reclaimd's JSON lines or OTLP/JSON lines, in reclaimd's dict shape."""
    with path.open(encoding="utf-8") as f:
        for raw in f:
            line = raw.strip()
            if not line:
                continue
            try:
                doc = json.loads(line)
            except ValueError:
                continue  # a torn last line after a crash
            if isinstance(doc, dict) and "resourceSpans" in doc:
                yield from _from_otlp(doc)
            elif isinstance(doc, dict) and "trace_id" in doc:
                yield doc


def _from_otlp(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for rs in doc.get("resourceSpans") or []:
        for ss in rs.get("scopeSpans") or []:
            for s in ss.get("spans") or []:
                status = s.get("status") or {}
                yield {
                    "trace_id": str(s.get("traceId", "")).lower(),
                    "span_id": str(s.get("spanId", "")).lower(),
                    "parent_id": str(s.get("parentSpanId", "")).lower(),
                    "name": s.get("name", ""),
                    "kind": _OTLP_KIND.get(int(s.get("kind", 0)), "UNSPECIFIED"),
                    "start_ns": int(s.get("startTimeUnixNano", 0)),
                    "end_ns": int(s.get("endTimeUnixNano", 0)),
                    "status": _OTLP_STATUS.get(int(status.get("code", 0)), "UNSET"),
                    "status_message": status.get("message", ""),
                    "attributes": _otlp_attrs(s.get("attributes")),
                    "events": [
                        {
                            "name": e.get("name", ""),
                            "ts_ns": int(e.get("timeUnixNano", 0)),
                            "attributes": _otlp_attrs(e.get("attributes")),
                        }
                        for e in s.get("events") or []
                    ],
                    "links": [
                        {
                            "trace_id": str(lk.get("traceId", "")).lower(),
                            "span_id": str(lk.get("spanId", "")).lower(),
                            "attributes": _otlp_attrs(lk.get("attributes")),
                        }
                        for lk in s.get("links") or []
                    ],
                }


def _otlp_attrs(items: Any) -> dict[str, Any]:
    return {kv["key"]: _otlp_value(kv.get("value") or {}) for kv in items or [] if "key" in kv}


def _otlp_value(v: dict[str, Any]) -> Any:
    if "stringValue" in v:
        return v["stringValue"]
    if "boolValue" in v:
        return bool(v["boolValue"])
    if "intValue" in v:
        return int(v["intValue"])  # a string in OTLP/JSON: int64 does not fit a JSON number
    if "doubleValue" in v:
        return float(v["doubleValue"])
    if "arrayValue" in v:
        return [_otlp_value(x) for x in (v["arrayValue"].get("values") or [])]
    return None


def trace_key(key: str) -> str:
    """A notice id, or the trace id alone when ``key`` is a trace id or a ``traceparent``."""
    parts = key.strip().split("-")
    if len(parts) == 4 and len(parts[1]) == 32:
        return parts[1].lower()
    return key.strip()


def _roots_for(spans: Iterable[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    wanted = trace_key(key)
    return [
        s
        for s in spans
        if s.get("name") == ROOT
        and (
            (s.get("attributes") or {}).get("reclaimd.notice.id") == wanted
            or s.get("trace_id") == wanted.lower()
        )
    ]


def find_trace(spans: Iterable[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """The spans of the notice's last trace (a resumed notice has one per attempt)."""
    by_trace: dict[str, list[dict[str, Any]]] = {}
    for s in spans:
        by_trace.setdefault(s["trace_id"], []).append(s)
    roots = _roots_for((s for group in by_trace.values() for s in group), key)
    if not roots:
        raise NotFound(f"no trace for notice or trace id {key!r}")
    return by_trace[max(roots, key=lambda s: s["start_ns"])["trace_id"]]


def load(path: Path | Iterable[Path], key: str) -> Timeline:
    """The timeline of ``key`` from one span file or several (one per reclaimd process)."""
    paths = [path] if isinstance(path, Path) else list(path)

    def spans() -> Iterator[dict[str, Any]]:
        for p in paths:
            yield from read_spans(p)

    roots = _roots_for(spans(), key)
    if not roots:
        raise NotFound(f"no trace for notice or trace id {key!r}")
    roots.sort(key=lambda s: s["start_ns"])
    last = roots[-1]["trace_id"]
    chosen = [s for s in spans() if s["trace_id"] == last]
    others = tuple(dict.fromkeys(r["trace_id"] for r in roots[:-1] if r["trace_id"] != last))
    return timeline(chosen, other_traces=others)


# --- the timeline -------------------------------------------------------------------------


def timeline(spans: list[dict[str, Any]], *, other_traces: tuple[str, ...] = ()) -> Timeline:
    root = next(s for s in spans if s["name"] == ROOT)
    a = root["attributes"]
    t0 = root["start_ns"]
    window_from_receipt: float | None = None
    lag: float | None = None
    deadline = str(a.get("reclaimd.deadline", "") or "")
    if deadline:
        from reclaimd.model import ParseError, parse_time

        try:
            window_from_receipt = parse_time(deadline).timestamp() - t0 / 1e9
        except ParseError:
            window_from_receipt = None
        window = a.get("reclaimd.window_s")
        if window_from_receipt is not None and isinstance(window, int | float):
            # window_s counts from the provider's notice time: the difference is the lag.
            lag = float(window) - window_from_receipt

    # A pod's gang: its rank span says it; an eviction span may not (older daemons).
    gang_of_pod: dict[str, str] = {}
    for s in spans:
        at = s["attributes"]
        if s["name"] == "reclaimd.checkpoint.rank" and "reclaimd.gang" in at:
            gang_of_pod[_pod(at)] = str(at["reclaimd.gang"])

    rows = [_row(s, t0, gang_of_pod) for s in spans if s["name"] != ROOT and s["name"] in _ORDER]
    rows.sort(key=lambda r: (r.start_s, _ORDER.get("reclaimd." + r.step, 99)))
    met = a.get("reclaimd.deadline_met")
    return Timeline(
        notice_id=str(a.get("reclaimd.notice.id", "")),
        trace_id=root["trace_id"],
        source=str(a.get("reclaimd.notice.source", "")),
        kind=str(a.get("reclaimd.notice.kind", "")),
        target=str(a.get("reclaimd.notice.target", "")),
        window_s=window_from_receipt,
        total_s=(root["end_ns"] - t0) / 1e9,
        rows=tuple(rows),
        receipt_lag_s=lag,
        deadline=deadline,
        met=met if isinstance(met, bool) else None,
        other_traces=other_traces,
    )


def _pod(at: dict[str, Any]) -> str:
    return f"{at.get('k8s.namespace.name', '')}/{at.get('k8s.pod.name', '')}"


def _row(s: dict[str, Any], t0: int, gang_of_pod: dict[str, str]) -> Row:
    at = s["attributes"]
    step = s["name"].removeprefix("reclaimd.")
    pod = _pod(at) if "k8s.pod.name" in at else ""
    rank = at.get("reclaimd.rank")
    return Row(
        step=step,
        subject=pod or str(at.get("k8s.node.name", "")),
        start_s=(s["start_ns"] - t0) / 1e9,
        end_s=(s["end_ns"] - t0) / 1e9,
        ok=s["status"] != "ERROR" and at.get("reclaimd.acked", True) is not False,
        detail=_detail(s),
        node=str(at.get("k8s.node.name", "")),
        gang=str(at.get("reclaimd.gang", "") or gang_of_pod.get(pod, "")) if pod else "",
        rank=int(rank) if isinstance(rank, int | float) else None,
    )


def _detail(s: dict[str, Any]) -> str:
    at = s["attributes"]
    if "reclaimd.eviction" in at:
        gone = at.get("reclaimd.gone")
        return f"{at['reclaimd.eviction']}" + ("" if gone is not False else ", still there")
    if "reclaimd.acked" in at:
        if at["reclaimd.acked"]:
            return "acked, durable" if at.get("reclaimd.durable") else "acked, not durable"
        return f"no ack: {at.get('reclaimd.error', '')}".rstrip(": ")
    if "reclaimd.error" in at:
        return str(at["reclaimd.error"])
    if s["status"] == "ERROR" and s.get("status_message"):
        return str(s["status_message"])
    return ""


# --- scales -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scale:
    """Seconds from ``lo`` to ``hi`` onto ``width`` units; ``deadline`` is None when it is off
    the scale (it lies to the right)."""

    lo: float
    hi: float
    width: float
    deadline: float | None = None
    ticks: tuple[float, ...] = field(default=())

    def x(self, seconds: float) -> float:
        span = self.hi - self.lo
        return (min(max(seconds, self.lo), self.hi) - self.lo) / span * self.width


def nice_step(span: float, target_ticks: int = 8) -> float:
    """A 1-2-5 step that cuts ``span`` into about ``target_ticks`` parts."""
    raw = max(span, 1e-9) / target_ticks
    mag = 10.0 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def _ticks(lo: float, hi: float) -> tuple[float, ...]:
    step = nice_step(hi - lo)
    first = math.ceil(lo / step) * step
    n = int((hi - first) / step + 1e-9) + 1
    return tuple(round(first + i * step, 9) for i in range(n))


def zoom_scale(t: Timeline, width: float) -> Scale:
    """The handling's scale; it reaches the deadline only when the deadline is near (within a
    quarter more than the handling took), else the deadline is named at the edge."""
    end = max([t.total_s, *(r.end_s for r in t.rows)], default=t.total_s)
    end = max(end, 1e-3)
    if t.window_s is not None and t.window_s <= end * 1.25:
        hi = max(end, t.window_s) * 1.04
        return Scale(0.0, hi, width, deadline=t.window_s, ticks=_ticks(0.0, hi))
    hi = end * 1.04
    return Scale(0.0, hi, width, deadline=None, ticks=_ticks(0.0, hi))


def window_scale(t: Timeline, width: float) -> Scale:
    """The deadline's scale, from the provider's notice time (before receipt) to the deadline."""
    lo = -(t.receipt_lag_s or 0.0) if (t.receipt_lag_s or 0.0) > 0 else 0.0
    hi = max(t.window_s or 0.0, t.total_s, 1e-3) * 1.02
    return Scale(lo, hi, width, deadline=t.window_s, ticks=_ticks(lo, hi))


def secs(s: float) -> str:
    if abs(s) >= 10:
        return f"{s:.1f} s"
    if abs(s) >= 1:
        return f"{s:.2f} s"
    return f"{s * 1000:.0f} ms"


def _when(deadline: str) -> str:
    from reclaimd.model import ParseError, parse_time, rfc3339

    try:
        return rfc3339(parse_time(deadline))
    except ParseError:
        return deadline


def tick(s: float) -> str:
    if s == 0:
        return "0"
    return f"{s:g} s" if abs(s) >= 1 else f"{s * 1000:g} ms"


def summary(t: Timeline) -> list[str]:
    lines = [f"notice {t.notice_id}  ({t.source} {t.kind} -> {t.target})", f"trace {t.trace_id}"]
    if t.other_traces:
        lines.append(f"earlier attempts (resumed): {', '.join(t.other_traces)}")
    if t.window_s is None:
        lines.append(f"no deadline; handled in {secs(t.total_s)}")
        return lines
    lag = (
        f"; received {secs(t.receipt_lag_s)} after the provider's notice"
        if (t.receipt_lag_s is not None)
        else ""
    )
    verdict = "deadline met" if t.deadline_met else "DEADLINE MISSED"
    left = t.window_s - t.total_s
    lines.append(
        f"deadline {_when(t.deadline)} = {secs(t.window_s)} after receipt{lag}; handled in"
        f" {secs(t.total_s)}, {secs(abs(left))} {'left' if left >= 0 else 'late'}: {verdict}"
    )
    return lines


# --- terminal -----------------------------------------------------------------------------


def render_text(t: Timeline, width: int = 40) -> str:
    """A terminal timeline: the window overview, then each section's rows on the zoomed scale.

    Bars are framed ``[...]``; ``|`` is the deadline (``!`` where a bar crosses it) and a
    closing ``]>`` says the deadline lies beyond the zoomed scale.
    """
    out = summary(t)
    if t.window_s is not None:
        ws = window_scale(t, width)
        bar = _bar(ws, 0.0, t.total_s, width)
        out.append(f"  window   {bar}  # handling, | deadline (+{secs(t.window_s)})")
    zs = zoom_scale(t, width)
    if t.window_s is None:
        edge = ""
    elif zs.deadline is None:
        edge = f"deadline at +{secs(t.window_s)}, off this scale (>)"
    else:
        edge = "| marks the deadline"
    out.append(f"  timeline 0 .. {secs(zs.hi)} after receipt   {edge}".rstrip())
    head = f"    {'STEP':<12} {'SUBJECT':<36} {'START':>8} {'END':>8} {'LEFT':>8}"
    out.append(f"{head}  {'':<{width + 3}} RESULT")
    for section, rows in t.sections():
        if section != NOTICE_SECTION:
            out.append(f"  gang {section}" if section != NO_GANG else f"  {NO_GANG}")
        for r in rows:
            out.append(_text_row(t, r, zs, width))
    return "\n".join(out)


def _bar(scale: Scale, start: float, end: float, width: int) -> str:
    lo = min(int(scale.x(start)), width - 1)
    hi = max(lo + 1, int(scale.x(end)))
    cells = [" "] * width
    for i in range(lo, min(hi, width)):
        cells[i] = "#"
    if scale.deadline is not None:
        d = min(int(scale.x(scale.deadline)), width - 1)
        cells[d] = "|" if cells[d] == " " else "!"
    return "[" + "".join(cells) + "]"


def _text_row(t: Timeline, r: Row, zs: Scale, width: int) -> str:
    bar = _bar(zs, r.start_s, r.end_s, width)
    bar += ">" if zs.deadline is None and t.window_s is not None else " "
    mark = "MISS" if t.missed(r) else ("ok" if r.ok else "FAIL")
    subject = r.subject + (f" @ {r.node}" if r.node and r.node != r.subject else "")
    indent = "  " if r.section != NOTICE_SECTION else ""
    label = f"{indent}{r.label}"
    left = t.left_s(r)
    left_text = f"{left:7.2f}s" if left is not None else f"{'-':>8}"
    return (
        f"    {label:<12} {subject[:36]:<36} {r.start_s:7.3f}s {r.end_s:7.3f}s {left_text}"
        f"  {bar} {mark} {r.detail}"
    ).rstrip()


# --- command line -------------------------------------------------------------------------


def add_parser(sub: Any) -> None:
    """``reclaimd postmortem`` under the CLI's subcommands."""
    p = sub.add_parser(
        "postmortem",
        help="timeline of one notice from its trace (terminal, SVG, HTML)",
        description="Where did the notice window go: a notice's steps, ranks and evictions"
        " against its deadline, from a span file.",
    )
    p.add_argument("key", metavar="NOTICE_ID|TRACE_ID", help="notice id, trace id or traceparent")
    p.add_argument(
        "--from",
        dest="span_files",
        action="append",
        type=Path,
        metavar="FILE",
        help="span file (reclaimd JSON lines or OTLP/JSON lines); repeat for several processes;"
        " default: tracing.span_file of --config, else the built-in default",
    )
    p.add_argument("--config", help="settings file whose tracing.span_file to read")
    p.add_argument("--svg", type=Path, metavar="OUT.svg", help="also write the picture as SVG")
    p.add_argument("--html", type=Path, metavar="OUT.html", help="also write a self-contained page")
    p.add_argument("--width", type=int, default=40, help="bar width in the terminal (columns)")
    p.set_defaults(func=cmd_postmortem)


def cmd_postmortem(args: argparse.Namespace) -> int:
    """Print the timeline; write the pictures asked for. 0 done, 2 bad input (one line)."""

    def say(message: str) -> None:
        print(f"reclaimd postmortem: {message}", file=sys.stderr)

    files: list[Path] = list(args.span_files or [])
    if not files:
        from reclaimd import config

        try:
            settings = config.load(args.config) if args.config else config.Settings()
        except config.ConfigError as e:
            say(str(e))
            return 2
        if settings.tracing.span_file is None:
            say("no span file: tracing.span_file is not set; name one with --from")
            return 2
        files = [settings.tracing.span_file]
    try:
        t = load(files, args.key)
    except NotFound as e:
        say(f"{e.args[0]} in {', '.join(str(f) for f in files)}")
        return 2
    except OSError as e:
        say(f"{e.filename or files[0]}: {e.strerror or e}")
        return 2
    print(render_text(t, width=max(10, args.width)))
    from reclaimd import postmortemsvg  # it imports this module: here, not at the top

    pictures = ((args.svg, postmortemsvg.render_svg), (args.html, postmortemsvg.render_html))
    for path, render in pictures:
        if path is None:
            continue
        try:
            path.write_text(render(t), encoding="utf-8")
        except OSError as e:
            say(f"{path}: {e.strerror or e}")
            return 2
        print(f"wrote {path}")
    return 0
