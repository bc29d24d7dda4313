"""``make bench-soak``: minutes of notices from every central source on two replicas, every
fault kind in turn, judged as every drill is, with each replica's RSS over time.

One drill (``chaos.drill.run``) of a generated scenario (written next to the JSON report, to rerun
with ``reclaimd drill run``):

- **Notices**: for ``--minutes`` (10), one EC2 Spot warning on SQS, one GCE preemption on
  Pub/Sub (the Logging sink's LogEntry, 30 s window) and one Kafka notice (90 s window) every
  ``--interval`` seconds (15) each, staggered, each for a node of its own; every fourth SQS and
  Kafka notice sent twice (a redelivery). Each node runs one gang: a 1-rank gang on a whole
  node, or a 2-rank gang packed on one.
- **Faults**, one after the other, evenly spread over the run (``--kinds`` picks, in this
  order): a kill with a container restart, a rolling upgrade (SIGTERM, a successor on a fresh
  disk), a pause longer than the claim lease, a Kafka outage, a cut from the apiserver, an
  apiserver restart, a fresh disk, a Pub/Sub emulator restart, a moto restart.
  ``chaos.drill.faults`` applies them, ``chaos.drill.faultdriver`` records them, as in every drill.
- **Judged** by the drill's own checks (``chaos.drill.verdict``): nothing lost, doubled or
  mis-charged, every window met (a miss while no replica could act is shown apart), the
  takeovers. The row is ``make bench-failover``'s (``chaos.bench.failover``).
- **Measured** besides: each replica's RSS (``VmRSS`` of its process, every ``--rss-every``
  seconds, a successor under its own name) and every GCE notice's send -> claim, with the
  faults under way when it was sent: the promise is a claim within 1 s whenever a live
  replica holds its slot.

JSON in ``out/bench-soak.json`` (the drill's own report in ``out/soak/``), a table on stdout.
Exit 1 when the run lost, doubled or mis-charged a gang's event or could not be judged, 2 on
bad arguments or no stack, 0 otherwise (missed windows are figures, as in bench-failover).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from chaos.bench.failover import run as failover
from chaos.bench.failover import scenario as failover_scenario
from chaos.drill import plan as planning
from chaos.drill import scenario as scenario_mod
from chaos.drill.run import Drill, Progress
from chaos.drill.scenario import ScenarioError

EXIT_OK, EXIT_FAILED, EXIT_USAGE = (
    failover_scenario.EXIT_OK,
    failover_scenario.EXIT_FAILED,
    failover_scenario.EXIT_USAGE,
)
DEFAULT_MINUTES = 10.0
DEFAULT_INTERVAL_S = 15.0
DEFAULT_RSS_EVERY_S = 5.0
CLAIM_WITHIN_S = 1.0  # a GCE notice's claim, when a live replica holds its slot
# A fault is "under way" for a notice sent from its start to this long after its outage
# ended: a successor's stream, a reconnect, a re-read take a few seconds.
AFTER_FAULT_S = 10.0
TAIL_S = 20.0  # no notice in the run's last seconds: the last fault's outage ends before

SOURCES = ("ec2-sqs", "gke-pubsub", "kafka")
POOL = {"ec2-sqs": "a", "gke-pubsub": "g", "kafka": "c"}
# Every fault kind, in the order they strike; the replica ones alternate between the two.
TURNS: dict[str, dict[str, Any]] = {
    "kill_restart": {"kind": "kill", "replica": 0, "restart_after_s": 3.0},
    "term_successor": {"kind": "term", "replica": 1, "restart_after_s": 1.0},
    "pause": {"kind": "pause", "replica": 0, "for_s": failover_scenario.CLAIM_LEASE_S + 5.0},
    "stop_kafka": {"kind": "stop_kafka", "for_s": 10.0},
    "partition": {"kind": "partition", "replica": 1, "for_s": 15.0},
    "restart_apiserver": {"kind": "restart_apiserver"},
    "fresh_disk": {"kind": "fresh_disk", "replica": 0, "restart_after_s": 2.0},
    "restart_pubsub": {"kind": "restart_pubsub"},
    "restart_moto": {"kind": "restart_moto"},
}


# --- the scenario ----------------------------------------------------------------------------


def generate(
    *,
    minutes: float = DEFAULT_MINUTES,
    interval_s: float = DEFAULT_INTERVAL_S,
    kinds: Sequence[str] = tuple(TURNS),
    seed: int = 1,
) -> dict[str, Any]:
    """The soak's scenario (a document ``chaos.drill.scenario.parse`` accepts). Pure."""
    length_s = minutes * 60.0
    per_source = max(1, math.floor((length_s - TAIL_S) / interval_s) + 1)
    pools, gangs, notices = [], [], []
    for s, source in enumerate(SOURCES):
        pool = POOL[source]
        shape = failover_scenario.POOL_SHAPES[pool]
        pools.append({"name": pool, "count": per_source, "gpus": 8, **shape})
        gangs += _gangs(pool, per_source)
        offset = interval_s * s / len(SOURCES)
        for i in range(per_source):
            n: dict[str, Any] = {
                "source": source,
                "target": {"nodes": [f"{pool}-{i}"]},
                "at_s": round(offset + i * interval_s, 1),
            }
            if source == "gke-pubsub":
                n["kind"] = "preemption"
            elif source == "kafka":
                n |= {"kind": "spot_interruption", "window_s": 90}
            if source != "gke-pubsub" and i % 4 == 3:
                n["duplicates"] = 1
            notices.append(n)
    notices.sort(key=lambda n: n["at_s"])
    faults = [
        {**TURNS[k], "at_s": round(length_s * (j + 0.5) / len(kinds), 1)}
        for j, k in enumerate(kinds)
    ]
    return {
        "name": "soak",
        "description": (
            f"bench-soak: {minutes:g} min of SQS, Pub/Sub and Kafka notices every"
            f" {interval_s:g} s each, 2 replicas; faults {', '.join(kinds)}"
        ),
        "seed": seed,
        "cluster": {"pools": pools},
        "gangs": gangs,
        "notices": notices,
        "faults": [_ordered(f) for f in faults],
        "reclaimd": {"replicas": 2},
        "expect": {"timeout_s": 120, "settle_s": 3},
    }


def _gangs(pool: str, nodes: int) -> list[dict[str, Any]]:
    """One gang per node: half 1-rank gangs on a whole node, half 2-rank gangs packed on one."""
    checkpoint = {
        "timeout_s": 10.0,
        "ack_latency_s": {"uniform": [0.1, 2.0]},
        "last_checkpoint_age_s": {"uniform": [300, 1800]},
        "pod_age_s": 7200,
    }
    solo = (nodes + 1) // 2
    out = [
        {
            "name": f"{pool}solo",
            "count": solo,
            "ranks": 1,
            "gpus_per_rank": 8,
            "placement": "spread",
            "pools": [pool],
            "checkpoint": checkpoint,
        }
    ]
    if nodes > solo:
        out.append(
            {
                "name": f"{pool}pair",
                "count": nodes - solo,
                "ranks": 2,
                "gpus_per_rank": 4,
                "placement": "packed",
                "pools": [pool],
                "checkpoint": checkpoint,
            }
        )
    return out


def _ordered(f: dict[str, Any]) -> dict[str, Any]:
    order = ("kind", "replica", "at_s", "for_s", "restart_after_s")
    return {k: f[k] for k in order if k in f}


def check(doc: dict[str, Any]) -> scenario_mod.Scenario:
    """The parsed scenario; ``ScenarioError`` when it is not valid or a notice hits no gang."""
    parsed = scenario_mod.parse(doc, origin="bench-soak")
    plan = planning.plan(parsed, run_id="gen")
    bare = [n.node for n in plan.notices if not plan.gangs_on(n.node or "")]
    if bare:
        raise ScenarioError(f"no gang on {', '.join(str(b) for b in bare[:5])}")
    return parsed


# --- the drill, with RSS sampled -------------------------------------------------------------


@dataclass
class RssSampler:
    """``VmRSS`` of each central replica's current process, every ``every_s``."""

    every_s: float
    samples: list[dict[str, Any]] = field(default_factory=list)
    t0: float = field(default_factory=time.monotonic)

    async def run(self, drill: Drill) -> None:
        while True:
            at = round(time.monotonic() - self.t0, 1)
            for i, d in enumerate(drill.world.replicas):
                if d.proc is None or d.proc.returncode is not None:
                    continue
                mb = rss_mb(d.proc.pid)
                if mb is not None:
                    self.samples.append(
                        {"t_s": at, "replica": i, "name": d.name, "pid": d.proc.pid, "rss_mb": mb}
                    )
            await asyncio.sleep(self.every_s)


def rss_mb(pid: int) -> float | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return None


class SoakDrill(Drill):
    """The drill as every drill runs, with the RSS sampler from the first notice to the stop."""

    def __init__(self, *args: Any, rss_every_s: float, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.rss = RssSampler(rss_every_s)
        self._sampler: asyncio.Task[None] | None = None

    async def _inject(self, h: Any) -> None:
        self.rss.t0 = time.monotonic()
        self._sampler = asyncio.create_task(self.rss.run(self))
        await super()._inject(h)

    async def _judge(self, h: Any) -> Any:
        self._stop_sampler()
        return await super()._judge(h)

    async def run(self) -> Any:
        try:
            return await super().run()
        finally:
            self._stop_sampler()

    def _stop_sampler(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()


# --- figures ---------------------------------------------------------------------------------


def rss_summary(samples: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per replica process (its name and pid: a container restart keeps the name): first,
    peak and last RSS, and when."""
    out: dict[str, dict[str, Any]] = {}
    for key in dict.fromkeys((s["name"], s["pid"]) for s in samples):
        mine = [s for s in samples if (s["name"], s["pid"]) == key]
        first, last = mine[0], mine[-1]
        out[f"{key[0]} pid {key[1]}"] = {
            "replica": first["replica"],
            "samples": len(mine),
            "from_s": first["t_s"],
            "to_s": last["t_s"],
            "first_mb": first["rss_mb"],
            "peak_mb": max(s["rss_mb"] for s in mine),
            "last_mb": last["rss_mb"],
        }
    return out


def _time(raw: str | None) -> datetime | None:
    return None if raw is None else datetime.fromisoformat(raw.replace("Z", "+00:00"))


def gce_claims(drill: dict[str, Any]) -> list[dict[str, Any]]:
    """Each GCE notice's send -> claim, and the faults under way when it was sent."""
    spans = []
    for f in drill["faults"]:
        start = _time(f["started_at"])
        end = _time(f["ended_at"]) or start
        if start is not None and end is not None:
            spans.append((f["fault"], start, end))
    out = []
    for n in drill["notices"]:
        if n["source"] != "gke-pubsub":
            continue
        sent, claimed = _time(n["sent_at"]), _time(n["claimed_at"])
        under_way = [
            label
            for label, start, end in spans
            if sent is not None and start <= sent and (sent - end).total_seconds() <= AFTER_FAULT_S
        ]
        out.append(
            {
                "label": n["label"],
                "notice_id": n["notice_id"],
                "claim_s": None
                if sent is None or claimed is None
                else round((claimed - sent).total_seconds(), 3),
                "deadline_met": n["deadline_met"],
                "faults_under_way": under_way,
            }
        )
    return out


def gce_summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    quiet = [r for r in rows if not r["faults_under_way"]]
    slow = [r for r in rows if r["claim_s"] is None or r["claim_s"] > CLAIM_WITHIN_S]
    claims = [r["claim_s"] for r in rows if r["claim_s"] is not None]
    quiet_claims = [r["claim_s"] for r in quiet if r["claim_s"] is not None]
    return {
        "notices": len(rows),
        "within_1s": sum(1 for r in rows if r["claim_s"] is not None and r["claim_s"] <= 1.0),
        "no_fault_under_way": len(quiet),
        "no_fault_within_1s": sum(1 for c in quiet_claims if c <= CLAIM_WITHIN_S),
        "p50_s": failover._r(failover._pct(claims, 50)),
        "p99_s": failover._r(failover._pct(claims, 99)),
        "max_s": failover._r(max(claims, default=None)),
        "no_fault_max_s": failover._r(max(quiet_claims, default=None)),
        "over_1s": [
            {k: r[k] for k in ("label", "claim_s", "faults_under_way", "deadline_met")}
            for r in slow
        ],
        "windows_missed": sum(1 for r in rows if r["deadline_met"] is False),
    }


def table(result: failover.RunResult, rss: dict[str, dict[str, Any]], gce: dict[str, Any]) -> str:
    lines = [failover.HEAD, failover.row(result), *failover.kind_rows([result]), ""]
    lines.append(f"{'replica':<32} {'samples':>7} {'from s':>7} {'to s':>7} {'first MB':>9}"
                 f" {'peak MB':>8} {'last MB':>8}")  # fmt: skip
    for name, r in rss.items():
        lines.append(
            f"{name:<32} {r['samples']:>7} {r['from_s']:>7.0f} {r['to_s']:>7.0f}"
            f" {r['first_mb']:>9.1f} {r['peak_mb']:>8.1f} {r['last_mb']:>8.1f}"
        )
    lines.append("")
    lines.append(
        f"GCE send -> claim: {gce['notices']} notices, {gce['within_1s']} within 1 s"
        f" (p50 {failover._s(gce['p50_s'])}, p99 {failover._s(gce['p99_s'])},"
        f" max {failover._s(gce['max_s'])} s); with no fault under way"
        f" {gce['no_fault_within_1s']} of {gce['no_fault_under_way']} within 1 s"
        f" (max {failover._s(gce['no_fault_max_s'])} s); windows missed {gce['windows_missed']}"
    )
    for r in gce["over_1s"]:
        during = ", ".join(r["faults_under_way"]) or "no fault under way"
        lines.append(f"  over 1 s: {r['label']:<16} {failover._s(r['claim_s']):>7} s  ({during})")
    return "\n".join(lines)


# --- running ---------------------------------------------------------------------------------


async def soak(args: argparse.Namespace) -> int:
    from chaos import stack as stackenv
    from chaos.drill.verdict.render import render, to_json

    kinds = failover._names(args.kinds, tuple(TURNS), "--kinds")
    doc = generate(minutes=args.minutes, interval_s=args.interval, kinds=kinds, seed=args.seed)
    parsed = check(doc)
    out = Path(args.out)
    out_dir = out.parent / "soak"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "soak.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    notices = len(doc["notices"])
    print(
        f"bench-soak: {args.minutes:g} min, {notices} notice groups, faults {', '.join(kinds)};"
        f" scenario {out_dir / 'soak.yaml'}",
        file=sys.stderr,
        flush=True,
    )
    env = stackenv.load()
    drill = SoakDrill(parsed, env, progress=Progress(sys.stderr), rss_every_s=args.rss_every)
    limit = failover.run_limit_s(doc)
    labels = ", ".join(failover_scenario.fault_label(f) for f in doc["faults"])
    t0 = time.monotonic()
    try:
        async with asyncio.timeout(limit):
            verdict = await drill.run()
    except TimeoutError:
        print(f"bench-soak: no verdict in {limit:.0f} s", file=sys.stderr)
        return EXIT_FAILED
    seconds = time.monotonic() - t0
    judged = to_json(verdict)
    _write(out_dir / "drill.json", judged)
    (out_dir / "drill.txt").write_text(render(verdict, all_rows=True) + "\n")
    result = failover.result_of(args.seed, labels, verdict, seconds)
    rss = rss_summary(drill.rss.samples)
    gce_rows = gce_claims(judged)
    gce = gce_summary(gce_rows)
    _write(
        out,
        {
            "minutes": args.minutes,
            "interval_s": args.interval,
            "kinds": list(kinds),
            "scenario": str(out_dir / "soak.yaml"),
            "drill_report": str(out_dir / "drill.json"),
            "seconds": round(seconds, 1),
            "ok": result.ok,
            "broken": result.broken,
            "notices": result.notices,
            "lost": result.lost,
            "late": result.late,
            "doubled": result.doubled,
            "over_charged": result.over,
            "under_charged": result.under,
            "deadlines_missed": result.missed,
            "late_while_nobody_up": result.nobody_up,
            "failed_checks": result.failed_checks,
            "takeover_by_fault_kind": failover.kind_totals([result]),
            "faults": judged["faults"],
            "gce_claims": gce | {"rows": gce_rows},
            "rss": rss,
            "rss_samples": drill.rss.samples,
        },
    )
    print(table(result, rss, gce), flush=True)
    return EXIT_FAILED if result.broken else EXIT_OK


def _write(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m chaos.bench.soak", description=__doc__.splitlines()[0]
    )
    p.add_argument("--minutes", type=float, default=DEFAULT_MINUTES, help="how long notices go out")
    p.add_argument(
        "--interval",
        type=float,
        default=DEFAULT_INTERVAL_S,
        help="seconds between two notices of one source",
    )
    p.add_argument("--kinds", default=",".join(TURNS), help="the faults, in turn")
    p.add_argument("--rss-every", type=float, default=DEFAULT_RSS_EVERY_S, help="RSS sample period")
    p.add_argument("--seed", type=int, default=1, help="the scenario's seed (trainer behaviour)")
    p.add_argument("--out", default="out/bench-soak.json", help="the JSON report")
    return p


def main(argv: list[str] | None = None) -> int:
    from chaos import stack as stackenv

    args = parser().parse_args(argv)
    if args.minutes <= 0 or args.interval <= 0 or args.rss_every <= 0:
        print("bench-soak: --minutes, --interval and --rss-every must be positive", file=sys.stderr)
        return EXIT_USAGE
    try:
        return asyncio.run(soak(args))
    except (ScenarioError, stackenv.StackNotRunning) as e:
        print(f"bench-soak: {e}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
