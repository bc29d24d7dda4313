"""A drill's traces read back: spans by notice, and when each phase of a notice happened."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from reclaimd.model import ParseError, parse_time

# --- traces ----------------------------------------------------------------------------------

ROOT = "reclaimd.notice"


def index_traces(spans: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """Spans by notice id: every trace whose root names the notice (a resumed notice, or one
    handled again by a peer, has more than one), or, without its root (a process killed
    before the root ended), whose drain or ledger span does."""
    by_trace: dict[str, list[Mapping[str, Any]]] = {}
    notice_of: dict[str, str] = {}
    for s in spans:
        by_trace.setdefault(s["trace_id"], []).append(s)
        named = str(s["attributes"].get("reclaimd.notice.id", ""))
        if s["name"] == ROOT or (s["name"] in ("reclaimd.drain", "reclaimd.ledger") and named):
            notice_of.setdefault(s["trace_id"], named)
    out: dict[str, list[Mapping[str, Any]]] = {}
    for trace_id, notice_id in notice_of.items():
        out.setdefault(notice_id, []).extend(by_trace[trace_id])
    return out


def phase_times(spans: Sequence[Mapping[str, Any]]) -> dict[str, datetime]:
    """When the notice was claimed, cordoned, had every rank asked, and was drained.

    ``all_signaled`` is when the last rank's request went out (the latest start of a
    per-rank span), or when the checkpoint step began if there was nobody to ask.
    """

    def at(ns: int) -> datetime:
        return _EPOCH + timedelta(microseconds=ns // 1000)

    def ends(name: str) -> list[datetime]:
        return [at(s["end_ns"]) for s in spans if s["name"] == name and s.get("end_ns")]

    out: dict[str, datetime] = {}
    for step, name, pick in (
        ("claimed", "reclaimd.claim", min),
        ("cordoned", "reclaimd.cordon", min),
        ("drained", "reclaimd.drain", max),
    ):
        found = ends(name)
        if found:
            out[step] = pick(found)
    ranks = [at(s["start_ns"]) for s in spans if s["name"] == "reclaimd.checkpoint.rank"]
    steps = [at(s["start_ns"]) for s in spans if s["name"] == "reclaimd.checkpoint"]
    if ranks:
        out["all_signaled"] = max(ranks)
    elif steps:
        out["all_signaled"] = min(steps)
    return out


_EPOCH = datetime.fromisoformat("1970-01-01T00:00:00+00:00")


def time_of(raw: object) -> datetime | None:
    if not isinstance(raw, str):
        return None
    try:
        return parse_time(raw)
    except ParseError:
        return None
