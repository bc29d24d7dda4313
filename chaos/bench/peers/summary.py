"""``make bench-peers``' summary: medians, ratios between the sides and the table."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from chaos.bench.peers.common import NTH_VERSION, percentile, ratio

# --- summary ----------------------------------------------------------------------------------


def _median(values: Sequence[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def summarize(runs: Sequence[dict[str, Any]], side: str) -> dict[str, Any] | None:
    """Pooled per-node figures over the side's runs; run totals as medians. A run that did not
    finish within its cap makes its side's max/makespan a lower bound (the cap)."""
    mine = [r for r in runs if r["side"] == side]
    if not mine:
        return None
    cordon = [x for r in mine for x in r["per_node"]["cordoned_s"]]
    drained = [x for r in mine for x in r["per_node"]["drained_s"]]
    complete = all(r["complete"] for r in mine)
    all_c = all(r["all_cordoned_s"] is not None for r in mine)
    all_d = all(r["all_drained_s"] is not None for r in mine)
    cap = max(r["elapsed_s"] for r in mine)

    def bound(values: list[float], ok: bool) -> dict[str, Any]:
        top = max(values, default=None)
        return {"value": top if ok else cap, "lower_bound": not ok}

    return {
        "runs": len(mine),
        "complete": complete,
        "nodes_per_run": mine[0]["nodes"],
        "cordoned_per_run": [r["cordoned"] for r in mine],
        "drained_per_run": [r["drained_nodes"] for r in mine],
        "cordoned_p50_s": percentile(cordon, 0.5) if all_c else None,
        "cordoned_max_s": bound(cordon, all_c),
        "drained_p50_s": percentile(drained, 0.5) if all_d else None,
        "drained_max_s": bound(drained, all_d),
        "all_cordoned_s": _bounded_median([r["all_cordoned_s"] for r in mine], cap),
        "all_drained_s": _bounded_median([r["all_drained_s"] for r in mine], cap),
        "makespan_s": _bounded_median([r["makespan_s"] for r in mine], cap),
        "queue_empty_s": _bounded_median([r["queue_empty_s"] for r in mine], cap),
        "requests": _median([r["requests"]["total"] for r in mine]),
        "writes": _median([r["requests"]["writes"] for r in mine]),
        "rejected": sum(r["requests"]["rejected"] for r in mine),
    }


def _bounded_median(values: Sequence[float | None], cap: float) -> dict[str, Any]:
    """Median over runs; a run that never got there counts as the cap, marked a lower bound."""
    done = [v for v in values if v is not None]
    filled = [v if v is not None else cap for v in values]
    return {"value": _median(filled), "lower_bound": len(done) < len(values)}


def ratios(nth: dict[str, Any], rc: dict[str, Any]) -> dict[str, Any]:
    """NTH / reclaimd; ``at_least`` when NTH's figure is a lower bound (it hit the cap)."""

    def b(key: str) -> dict[str, Any]:
        n, r = nth[key], rc[key]
        return {"ratio": ratio(n["value"], r["value"]), "at_least": n["lower_bound"]}

    out = {
        "cordoned_p50": {"ratio": ratio(nth["cordoned_p50_s"], rc["cordoned_p50_s"]),
                         "at_least": nth["cordoned_p50_s"] is None},
        "cordoned_max": b("cordoned_max_s"),
        "drained_p50": {"ratio": ratio(nth["drained_p50_s"], rc["drained_p50_s"]),
                        "at_least": nth["drained_p50_s"] is None},
        "drained_max": b("drained_max_s"),
        "all_cordoned": b("all_cordoned_s"),
        "all_drained": b("all_drained_s"),
        "makespan": b("makespan_s"),
        "requests": {"ratio": ratio(nth["requests"], rc["requests"]), "at_least": False},
    }  # fmt: skip
    for key in ("all_cordoned", "all_drained"):
        value = out[key]["ratio"]
        out[key]["target_10x_met"] = value is not None and value >= 10
    return out


def table(summary: dict[str, Any], rat: dict[str, Any] | None) -> str:
    def cell(v: Any) -> str:
        if isinstance(v, dict):
            if v.get("value") is None:
                return "-"
            return (">" if v["lower_bound"] else "") + f"{v['value']:.1f}"
        return "-" if v is None else f"{v:.1f}" if isinstance(v, float) else str(v)

    rows = [
        ("send->cordoned p50 s", "cordoned_p50_s", "cordoned_p50"),
        ("send->cordoned max s", "cordoned_max_s", "cordoned_max"),
        ("send->pods gone p50 s", "drained_p50_s", "drained_p50"),
        ("send->pods gone max s", "drained_max_s", "drained_max"),
        ("all cordoned s", "all_cordoned_s", "all_cordoned"),
        ("all drained s", "all_drained_s", "all_drained"),
        ("makespan s", "makespan_s", "makespan"),
        ("queue empty s", "queue_empty_s", None),
        ("API requests / run", "requests", "requests"),
        ("  of which writes", "writes", None),
        ("APF rejections (all runs)", "rejected", None),
    ]
    nth, rc = summary.get("nth"), summary.get("reclaimd")
    lines = [f"{'':28}{'NTH ' + NTH_VERSION:>16}{'reclaimd':>12}{'NTH/reclaimd':>14}"]
    for title, key, rkey in rows:
        a = cell(nth[key]) if nth else "-"
        c = cell(rc[key]) if rc else "-"
        x = "-"
        if rat and rkey:
            rv = rat[rkey]
            if rv["ratio"] is not None:
                x = (">=" if rv["at_least"] else "") + f"{rv['ratio']:.1f}x"
        lines.append(f"{title:28}{a:>16}{c:>12}{x:>14}")
    if nth:
        lines.append(
            f"NTH nodes cordoned per run: {nth['cordoned_per_run']}, drained: "
            f"{nth['drained_per_run']} (of {nth['nodes_per_run']})"
        )
    if rc:
        lines.append(
            f"reclaimd nodes cordoned per run: {rc['cordoned_per_run']}, drained: "
            f"{rc['drained_per_run']} (of {rc['nodes_per_run']})"
        )
    if rat:
        for key in ("all_cordoned", "all_drained"):
            v = rat[key]
            met = "met" if v["target_10x_met"] else "NOT met"
            lines.append(
                f"target reclaimd >= 10x faster than NTH to {key.replace('_', '-')}: {met}"
            )
    return "\n".join(lines)
