"""Where did the notice window go? A timeline of one notice from its trace.

Input is the JSON-lines span file the tracer writes (``tracing.JsonLinesExporter``). A notice
is found by its id (the root span's ``reclaimd.notice.id``) or by its trace id. Each row is one
step with its start and end in seconds after the notice was received, and how far it ended
from the deadline.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
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

    @property
    def deadline_met(self) -> bool:
        return self.window_s is None or all(
            r.end_s <= self.window_s for r in self.rows if r.step != "checkpoint.rank"
        )


def read_spans(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        for raw in f:
            line = raw.strip()
            if line:
                try:
                    yield json.loads(line)
                except ValueError:
                    continue  # a torn last line after a crash


def find_trace(spans: Iterable[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    by_trace: dict[str, list[dict[str, Any]]] = {}
    wanted = ""
    for s in spans:
        by_trace.setdefault(s["trace_id"], []).append(s)
        if s["name"] == ROOT and (
            s["attributes"].get("reclaimd.notice.id") == key or s["trace_id"] == key
        ):
            wanted = s["trace_id"]
    if not wanted:
        raise NotFound(f"no trace for notice or trace id {key!r}")
    return by_trace[wanted]


def timeline(spans: list[dict[str, Any]]) -> Timeline:
    root = next(s for s in spans if s["name"] == ROOT)
    a = root["attributes"]
    t0 = root["start_ns"]
    window = a.get("reclaimd.window_s")
    deadline = a.get("reclaimd.deadline")
    window_from_receipt: float | None = None
    if deadline is not None and window is not None:
        from reclaimd.model import parse_time

        received_s = t0 / 1e9
        window_from_receipt = parse_time(str(deadline)).timestamp() - received_s

    def subject(s: dict[str, Any]) -> str:
        at = s["attributes"]
        if "k8s.pod.name" in at:
            return f"{at.get('k8s.namespace.name', '')}/{at['k8s.pod.name']}"
        return str(at.get("k8s.node.name", ""))

    def detail(s: dict[str, Any]) -> str:
        at = s["attributes"]
        for key in ("reclaimd.eviction", "reclaimd.error"):
            if key in at:
                return str(at[key])
        if "reclaimd.acked" in at:
            return "acked" if at["reclaimd.acked"] else "no ack"
        return ""

    rows = [
        Row(
            step=s["name"].removeprefix("reclaimd."),
            subject=subject(s),
            start_s=(s["start_ns"] - t0) / 1e9,
            end_s=(s["end_ns"] - t0) / 1e9,
            ok=s["status"] != "ERROR" and s["attributes"].get("reclaimd.acked", True) is not False,
            detail=detail(s),
        )
        for s in spans
        if s["name"] != ROOT and s["name"] in _ORDER
    ]
    rows.sort(key=lambda r: (r.start_s, _ORDER.get("reclaimd." + r.step, 99)))
    return Timeline(
        notice_id=str(a.get("reclaimd.notice.id", "")),
        trace_id=root["trace_id"],
        source=str(a.get("reclaimd.notice.source", "")),
        kind=str(a.get("reclaimd.notice.kind", "")),
        target=str(a.get("reclaimd.notice.target", "")),
        window_s=window_from_receipt,
        total_s=(root["end_ns"] - t0) / 1e9,
        rows=tuple(rows),
    )


def load(path: Path, key: str) -> Timeline:
    return timeline(find_trace(read_spans(path), key))


def render_text(t: Timeline, width: int = 40) -> str:
    """A terminal timeline: one line per step, a bar on a scale that ends at the deadline."""
    scale = max(t.window_s or 0.0, t.total_s, 1e-3)
    out = [
        f"notice {t.notice_id}  ({t.source} {t.kind} -> {t.target})  trace {t.trace_id}",
        (
            f"window {t.window_s:.1f} s from receipt; handled in {t.total_s:.2f} s"
            if t.window_s is not None
            else f"no deadline; handled in {t.total_s:.2f} s"
        ),
    ]
    for r in t.rows:
        lo = int(r.start_s / scale * width)
        hi = max(lo + 1, int(r.end_s / scale * width))
        bar = " " * lo + "#" * (hi - lo)
        late = t.window_s is not None and r.end_s > t.window_s
        mark = "MISS" if late else ("ok" if r.ok else "FAIL")
        label = f"{r.step:<16} {r.subject[:34]:<34}"
        out.append(
            f"  {label} {r.start_s:7.3f}s -> {r.end_s:7.3f}s |{bar:<{width}}| {mark} {r.detail}"
        )
    return "\n".join(out)
