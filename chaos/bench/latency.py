"""``make bench``: single-notice latency on the local stack, as JSON.

N notices, one at a time, each for its own kwok node running a 2-rank gang whose fake trainers
ack at once (so the figures are reclaimd's own overhead plus the stack's, not a trainer's save).
For each notice the step times come from its trace: received -> claimed -> cordoned -> all
ranks signaled -> drained -> recorded, in seconds after the notice was received. Reported as
median and p99 over the N notices. Timings are never asserted anywhere: machines are noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
from pathlib import Path
from typing import Any

from chaos import stack as stackenv
from chaos.harness import Harness
from chaos.trainers import Behaviour
from reclaimd import postmortem
from reclaimd.model import utcnow

STEPS = {
    "claimed": "claim",
    "cordoned": "cordon",
    "signaled": "checkpoint",
    "drained": "drain",
    "recorded": "ledger",
}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = max(0, min(len(ordered) - 1, round(q * (len(ordered) - 1))))
    return ordered[k]


def step_ends(t: postmortem.Timeline) -> dict[str, float]:
    ends: dict[str, float] = {}
    for name, span in STEPS.items():
        rows = [r for r in t.rows if r.step == span]
        if rows:
            ends[name] = max(r.end_s for r in rows)
    return ends


async def single_notice_latency(n: int) -> dict[str, Any]:
    stack = stackenv.load()
    async with Harness(stack, name=f"bench{utcnow():%H%M%S}") as h:
        nodes = [h.node_spec(i) for i in range(n)]
        await h.add_nodes(nodes)
        instant = Behaviour(ack_latency_s=(0.0, 0.0))
        for i, node in enumerate(nodes):
            await h.add_gang(f"g{i}", [node.name, node.name], behaviour=instant)
        await h.start_daemon()
        notice_ids = []
        for i, node in enumerate(nodes):
            notice = h.send_spot(node)
            notice_ids.append(notice.id)
            await h.ledger_events(count=i + 1, timeout_s=60)
            print(f"bench: {i + 1}/{n} notices handled", file=sys.stderr, flush=True)
        await asyncio.sleep(1.0)  # the span exporter writes in batches
        for d in h.daemons:
            await d.stop()
        per_step: dict[str, list[float]] = {k: [] for k in STEPS}
        missing = 0
        for nid in notice_ids:
            try:
                ends = step_ends(postmortem.load(h.span_file, nid))
            except postmortem.NotFound:
                missing += 1
                continue
            for k, v in ends.items():
                per_step[k].append(v)
    return {
        "benchmark": "single_notice_latency",
        "notices": n,
        "traces_missing": missing,
        "ranks_per_notice": 2,
        "trainer_ack_latency_s": 0.0,
        "unit": "seconds after the notice was received",
        "steps": {
            k: {
                "median": round(statistics.median(v), 4) if v else None,
                "p99": round(percentile(v, 0.99), 4) if v else None,
                "max": round(max(v), 4) if v else None,
                "count": len(v),
            }
            for k, v in per_step.items()
        },
        "machine": {"python": platform.python_version(), "cpus": _cpus()},
    }


def _cpus() -> int:
    import os

    return os.cpu_count() or 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="chaos.bench.latency")
    p.add_argument("--notices", type=int, default=50)
    p.add_argument("--out", type=Path, default=Path("out/bench.json"))
    args = p.parse_args(argv)
    try:
        result = asyncio.run(single_notice_latency(args.notices))
    except stackenv.StackNotRunning as e:
        print(f"bench: {e}", file=sys.stderr)
        return 2
    text = json.dumps({"results": [result]}, indent=2)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
