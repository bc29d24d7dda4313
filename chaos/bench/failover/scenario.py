"""One run of ``make bench-failover``: its seeds and the scenario generated from one (sources,
storm, gangs, notices and 1-3 faults on two replicas), valid by the scenario's own rules."""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from chaos.drill import plan as planning
from chaos.drill import scenario as scenario_mod
from chaos.drill.scenario import ScenarioError

if TYPE_CHECKING:
    pass

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
DEFAULT_RUNS = 20
SOURCES = ("ec2-sqs", "gke-pubsub", "kueue", "kafka")
KINDS = (
    "kill",
    "kill_restart",
    "fresh_disk",
    "pause",
    "term",
    "term_successor",
    "partition",
    "stop_kafka",
    "restart_apiserver",
)
STACK_KINDS = frozenset({"stop_kafka", "restart_apiserver"})
# A replica that goes silent (alive but unheard: paused, or cut from the apiserver) is the
# failover hardest to tell from a slow one (issue 37): most runs draw one, the others still
# draw every kind uniformly.
SILENT_KINDS = ("pause", "partition")
SILENT_SHARE = 0.8  # a run's first fault is a silence this often (the rest add a few more)
CLAIM_LEASE_S = 20.0  # reclaimd's claim_stale_s: a pause longer than it loses the claims
# Silence is told from death within seconds (the peer probe), not by the lease alone: pauses
# both shorter and longer than the lease, so both a presumed-dead holder that comes back and
# one whose claims are taken over are drawn.
PAUSE_S = (4.0, 30.0)
MIN_NODES, MAX_NODES = 8, 60
GAP_S = 8.0  # between two faults on one replica: a successor's start takes a few seconds
BUILD_BOUND_S = 240.0  # a run's time limit: this, the storm and faults, the drill's own wait
JUDGE_BOUND_S = 120.0


def run_seeds(seed: int, runs: int) -> list[int]:
    """The campaign's runs: the campaign seed first, then seeds derived from it."""
    out = [seed]
    for i in range(1, runs):
        digest = hashlib.sha256(f"reclaimd-failover/{seed}/{i}".encode()).hexdigest()
        out.append(int(digest[:8], 16))
    return out


# --- one run's scenario ----------------------------------------------------------------------


@dataclass
class _Pools:
    """Which pools the run has, by role, and their node counts."""

    counts: dict[str, int] = field(default_factory=dict)

    def add(self, name: str, count: int) -> None:
        self.counts[name] = count


POOL_SHAPES: dict[str, dict[str, Any]] = {
    # ec2-sqs targets; its gangs may span into the on-demand pool b
    "a": {"sku": "p5.48xlarge", "zone": "us-east-2a", "cell": "use2-cell-1"},
    "b": {"sku": "p5.48xlarge", "zone": "us-east-2b", "purchase_option": "on_demand"},
    # kafka node targets
    "c": {"sku": "p5.48xlarge", "zone": "us-east-2c", "cell": "use2-cell-3"},
    # gke-pubsub targets (GCE Spot)
    "g": {
        "sku": "a3-highgpu-8g",
        "zone": "us-central1-a",
        "cloud": "gce",
        "project": "reclaimd-local",
        "cell": "usc1-cell-1",
    },
    # Kueue pod groups (healthy on-demand nodes: a reclaim is quota, not capacity)
    "k": {"sku": "p5.48xlarge", "zone": "us-east-2a", "purchase_option": "on_demand"},
}


def generate(
    seed: int, *, kinds: Sequence[str] = KINDS, sources: Sequence[str] = SOURCES
) -> dict[str, Any]:
    """The scenario (a document ``chaos.drill.scenario.parse`` accepts) of the run with ``seed``.

    Pure: the same seed and the same kinds and sources give the same document."""
    rng = random.Random(seed)
    for _ in range(20):  # a draw that does not fit its fleet is drawn again, from the same rng
        doc = _draw(rng, seed, kinds, sources)
        try:
            plan = planning.plan(scenario_mod.parse(doc), run_id="gen")
        except ScenarioError:
            continue
        if any(n.gang or plan.gangs_on(n.node or "") for n in plan.notices):
            return doc  # else the notices touch no gang: the run would rehearse nothing
    raise ScenarioError(f"seed {seed}: no valid scenario in 20 draws")  # pragma: no cover


def _draw(
    rng: random.Random, seed: int, kinds: Sequence[str], sources: Sequence[str]
) -> dict[str, Any]:
    mix = sorted(rng.sample(list(sources), rng.randint(1, min(3, len(sources)))))
    total = rng.randint(MIN_NODES, MAX_NODES)
    roles = [{"ec2-sqs": "a", "kafka": "c", "gke-pubsub": "g", "kueue": "k"}[s] for s in mix]
    if "a" in roles or "c" in roles:
        roles.append("b")  # on-demand capacity AWS gangs may span into
    weights = {r: rng.uniform(0.6, 1.4) * (0.5 if r == "b" else 1.0) for r in roles}
    pools = _Pools()
    left = total
    for i, role in enumerate(roles):
        share = weights[role] / sum(weights[r] for r in roles[i:])
        count = left if i == len(roles) - 1 else max(2, round(left * share))
        count = max(2, min(count, left - 2 * (len(roles) - i - 1)))
        pools.add(role, count)
        left -= count
    gangs = _gangs(rng, pools)
    notices, storm_end = _notices(rng, mix, gangs)
    faults = _faults(rng, kinds, storm_end)
    names = ", ".join(mix)
    labels = ", ".join(fault_label(f) for f in faults)
    return {
        "name": f"failover-{seed}",
        "description": f"bench-failover run {seed}: {names}, {total} nodes; faults {labels}",
        "seed": seed,
        "cluster": {
            "pools": [
                {"name": name, "count": n, "gpus": 8, **POOL_SHAPES[name]}
                for name, n in pools.counts.items()
            ]
        },
        "gangs": gangs,
        "notices": notices,
        "faults": faults,
        "reclaimd": {"replicas": 2},
        # the drill's wait begins once every fault is over (each fault's outage is awaited)
        "expect": {"timeout_s": 120, "settle_s": 3},
    }


def _checkpoint(rng: random.Random, window_s: float) -> dict[str, Any]:
    """A trainer behaviour that can meet its window (the budget is cut by the drain reserve)."""
    hi = rng.uniform(0.8, min(6.0, window_s / 5))
    out: dict[str, Any] = {
        "timeout_s": round(rng.uniform(8.0, 15.0), 1),
        "ack_latency_s": {"uniform": [0.1, round(hi, 2)]},
        "last_checkpoint_age_s": {"uniform": [300, 1800]},
        "pod_age_s": 7200,
    }
    if rng.random() < 0.3:
        out["fail"] = 0.1
    if rng.random() < 0.2:
        out["hang"] = 0.1
    if rng.random() < 0.3:
        out["durable"] = 0.8
    if rng.random() < 0.15:
        out["opt_in"] = 0.5
    if rng.random() < 0.2:
        out["scope"] = "leader"
    return out


def _gangs(rng: random.Random, pools: _Pools) -> list[dict[str, Any]]:
    """Gang groups filling about half to 90 % of each pool's GPUs."""
    gangs: list[dict[str, Any]] = []
    counts = pools.counts
    windows = {"a": 120.0, "c": 90.0, "g": 30.0, "k": 30.0}
    for role in ("a", "c", "g", "k"):
        if role not in counts:
            continue
        n = counts[role]
        spans = role in ("a", "c") and "b" in counts
        free = n * 8 * rng.uniform(0.5, 0.9)
        groups = 0
        while free >= 8 and groups < 4:
            ranks = rng.choice([1, 1, 2, 2, 3, 4, 6, 8])
            placement = rng.choice(["spread", "spread", "packed"])
            gpus_per_rank = 8 if placement == "spread" else rng.choice([2, 4])
            reach = n + (counts["b"] if spans else 0)
            if placement == "spread" and ranks > reach:
                ranks = reach
            per_gang = ranks * gpus_per_rank
            count = max(1, min(rng.randint(1, 6), int(free // per_gang)))
            if per_gang > free:
                break
            group: dict[str, Any] = {
                "name": f"{role}g{groups}",
                "count": count,
                "ranks": ranks,
                "gpus_per_rank": gpus_per_rank,
                "placement": placement,
                "pools": [role, "b"] if spans and ranks > 1 and rng.random() < 0.5 else [role],
                "checkpoint": _checkpoint(rng, windows[role]),
            }
            if role == "k":
                group["integration"] = "kueue"
                group["queue"] = "lq-batch"
                group["pools"] = ["k"]
            if rng.random() < 0.25:
                group["pdb_max_unavailable"] = rng.choice([0, 1])
            gangs.append(group)
            free -= count * per_gang
            groups += 1
    return gangs


def _notices(
    rng: random.Random, mix: Sequence[str], gangs: Sequence[dict[str, Any]]
) -> tuple[list[dict[str, Any]], float]:
    notices: list[dict[str, Any]] = []
    end = 0.0
    for source in mix:
        at = round(rng.uniform(0.0, 4.0), 1)
        spread = round(rng.uniform(0.0, 10.0), 1)
        n: dict[str, Any] = {"source": source, "at_s": at, "spread_s": spread}
        if source == "ec2-sqs":
            n["target"] = {"pool": "a", "fraction": round(rng.uniform(0.3, 1.0), 2)}
            if rng.random() < 0.3:
                n["duplicates"] = 1
        elif source == "gke-pubsub":
            n["kind"] = "preemption"
            n["target"] = {"pool": "g", "fraction": round(rng.uniform(0.3, 1.0), 2)}
            n["spread_s"] = spread = round(min(spread, 6.0), 1)
        elif source == "kafka":
            n["kind"] = "spot_interruption"
            n["target"] = {"pool": "c", "fraction": round(rng.uniform(0.3, 1.0), 2)}
            n["window_s"] = rng.choice([60, 90, 120])
            if rng.random() < 0.3:
                n["duplicates"] = 1
        else:  # kueue: some of the Kueue pod groups
            names = [
                g["name"] if g["count"] == 1 else f"{g['name']}-{i}"
                for g in gangs
                if g.get("integration") == "kueue"
                for i in range(g["count"])
            ]
            if not names:
                continue
            n["target"] = {"count": rng.randint(1, min(4, len(names)))}
            n["pods_stop_after_s"] = round(rng.uniform(5.0, 20.0), 1)
        notices.append(n)
        end = max(end, at + spread)
    return notices, end


def silenced(doc: dict[str, Any]) -> bool:
    """The run has a pause or a partition (a replica silent, not dead)."""
    return any(f["kind"] in SILENT_KINDS for f in doc["faults"])


def _fault_end(f: dict[str, Any]) -> float:
    return float(f["at_s"]) + float(f.get("for_s", 0.0)) + float(f.get("restart_after_s", 0.0))


def fault_label(f: dict[str, Any]) -> str:
    kind = str(f["kind"])
    if kind in ("kill", "term") and "restart_after_s" in f:
        kind += "+successor" if kind == "term" else "+restart"
    who = f" r{f['replica']}" if "replica" in f else ""
    return f"{kind}{who}@{f['at_s']:g}"


def _faults(rng: random.Random, kinds: Sequence[str], storm_end: float) -> list[dict[str, Any]]:
    """1-3 faults inside the storm, never two at once on one replica, and one replica back;
    the first a pause or a partition in ``SILENT_SHARE`` of the runs."""
    wanted = rng.randint(1, 3)
    out: list[dict[str, Any]] = []
    busy: dict[int, list[tuple[float, float]]] = {0: [], 1: []}
    gone: set[int] = set()
    stack_used: set[str] = set()
    silent = [k for k in SILENT_KINDS if k in kinds]
    # drawn first, so the first fault (never refused: nothing is busy yet) is the silence
    silence_first = bool(silent) and rng.random() < SILENT_SHARE
    for attempt in range(wanted * 6):
        if len(out) == wanted:
            break
        kind = rng.choice(silent) if attempt == 0 and silence_first else rng.choice(list(kinds))
        at = round(rng.uniform(0.5, max(1.0, storm_end + 2.0)), 1)
        if kind in STACK_KINDS:
            if kind in stack_used:
                continue
            stack_used.add(kind)
            f: dict[str, Any] = {"kind": kind, "at_s": at}
            if kind == "stop_kafka":
                f["for_s"] = round(rng.uniform(3.0, 10.0), 1)
            out.append(f)
            continue
        replica = rng.randint(0, 1)
        f = {"replica": replica, "at_s": at}
        if kind == "kill":
            f["kind"] = "kill"
        elif kind == "kill_restart":
            f |= {"kind": "kill", "restart_after_s": round(rng.uniform(1.0, 8.0), 1)}
        elif kind == "fresh_disk":
            f |= {"kind": "fresh_disk", "restart_after_s": round(rng.uniform(1.0, 3.0), 1)}
        elif kind == "pause":
            f |= {"kind": "pause", "for_s": round(rng.uniform(*PAUSE_S), 1)}
        elif kind == "term":
            f["kind"] = "term"
        elif kind == "term_successor":
            f |= {"kind": "term", "restart_after_s": round(rng.uniform(0.0, 3.0), 1)}
        else:
            f |= {"kind": "partition", "for_s": round(rng.uniform(5.0, 30.0), 1)}
        for_good = f["kind"] in ("kill", "term") and "restart_after_s" not in f
        if replica in gone or (for_good and gone):
            continue  # after it is gone nothing happens to it; one replica always comes back
        start, end = at, math.inf if for_good else _fault_end(f) + GAP_S
        if any(start <= e and s <= end for s, e in busy[replica]):
            continue
        busy[replica].append((start - GAP_S, end))
        if for_good:
            gone.add(replica)
        out.append(f)
    order = ("kind", "replica", "at_s", "for_s", "restart_after_s")
    return [{k: f[k] for k in order if k in f} for f in sorted(out, key=lambda f: f["at_s"])]
