"""``make bench-failover``: a randomized fault campaign, in the spirit of Jepsen.

``python -m chaos.bench.failover.run --runs N --seed S --out out/bench-failover.json`` runs N
drills one after the other. Each run's scenario is generated from a seed of its own (run 0's
is the campaign seed itself, run i's is derived from it), so ``--runs 1 --seed <a run's seed>``
reruns exactly that run (same fleet, gangs, notices, faults and times; the same ``--kinds`` and
``--sources``, if the campaign was given any). A generated scenario picks:

- a source mix: one to three of ``ec2-sqs`` (EventBridge events on SQS, EC2's 120 s),
  ``gke-pubsub`` (Cloud Audit LogEntries on Pub/Sub, GCE's 30 s), ``kueue`` (a Workload
  preempted, the 30 s grace) and ``kafka`` (CloudEvents with a window of their own);
- a storm small enough for a 2-core machine: 8-60 nodes, gangs of 1-8 ranks (spread across
  nodes, some across pools, some packed), a PodDisruptionBudget on some, trainers with a
  latency range and a few failing, hanging or not-durable ranks;
- two replicas and 1-3 faults of random kinds (kill, kill+restart, fresh_disk, a pause of
  4-30 s, shorter or longer than the claim lease, term, term+successor, partition, stop_kafka,
  restart_apiserver) on random replicas at random times inside the storm, most runs with a
  pause or a partition (a silent replica, issue 37; ``silence_line`` says which). Faults
  may overlap across replicas, never on one replica, and at least one replica always comes
  back (the scenario validator's rules).

Each run is judged by the drill's own ground-truth checks (``chaos.drill.verdict``) and bounded in
time. It prints one row per run (seed, faults, gangs lost, late, doubled, over- and
under-charged, deadlines missed, late while no replica could act (``nobody``: outside the
promise, shown apart), takeover p50/p99/max less the time no replica could act and the max
from the fault (``raw max``), takeovers of a live holder, actions by a fenced holder), the
total and the takeovers by fault kind, and writes every generated scenario next to the JSON
report (``out/failover/<seed>.yaml``, to ship a failing one as a fixed scenario, or to run it
with ``reclaimd drill run``) with that run's drill report (``<seed>.json``). Exit status 1
when a run lost, doubled or mis-charged a gang's event, or could not be judged (it failed or
ran out of time); 2 for bad arguments or no stack; 0 otherwise. Missed deadlines and false takeovers
are figures, not failures: a pause on the replica holding a 30 s notice misses its deadline."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from chaos.bench.failover.scenario import (
    BUILD_BOUND_S,
    DEFAULT_RUNS,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    JUDGE_BOUND_S,
    KINDS,
    SOURCES,
    fault_label,
    generate,
    run_seeds,
    silenced,
)
from chaos.drill import scenario as scenario_mod
from chaos.drill.scenario import ScenarioError

if TYPE_CHECKING:
    from chaos.drill.verdict.model import Verdict

# --- running -----------------------------------------------------------------------------------


@dataclass
class RunResult:
    seed: int
    faults: str
    ok: bool = False
    aborted: str = ""  # the run could not be judged: why
    notices: int = 0
    lost: int = 0
    late: int = 0
    doubled: int = 0
    over: int = 0
    under: int = 0
    missed: int = 0
    nobody_up: int = 0  # late while no replica could act: shown, outside the promise
    takeovers: list[float] = field(default_factory=list)  # less the time no replica could act
    raw_takeovers: list[float] = field(default_factory=list)  # from the fault
    by_kind: dict[str, list[float]] = field(default_factory=dict)  # the same, by fault kind
    live_takeovers: int = 0
    fenced: int = 0
    gave_up: bool = False
    failed_checks: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def broken(self) -> bool:
        """What makes the campaign fail: an event lost, doubled or mis-charged, or no verdict."""
        return bool(self.aborted or self.lost or self.doubled or self.over or self.under)


def result_of(seed: int, faults: str, verdict: Verdict, seconds: float) -> RunResult:
    u = verdict.summary
    assert u is not None
    return RunResult(
        seed=seed,
        faults=faults,
        ok=verdict.ok,
        notices=u.notices,
        lost=u.lost,
        late=u.late,
        doubled=u.doubled,
        over=u.over_charged,
        under=u.under_charged,
        missed=u.deadlines_missed,
        takeovers=sorted(
            t.net_s for f in verdict.faults for t in f.taken_over if t.net_s is not None
        ),
        raw_takeovers=sorted(
            t.after_s for f in verdict.faults for t in f.taken_over if t.after_s is not None
        ),
        by_kind=_by_kind(verdict),
        nobody_up=u.deadlines_nobody_up,
        live_takeovers=u.live_takeovers,
        fenced=u.fenced_actions,
        gave_up=u.gave_up,
        failed_checks=[c.name for c in verdict.checks if c.required and not c.ok],
        seconds=seconds,
    )


def _by_kind(verdict: Verdict) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for f in verdict.faults:
        for t in f.taken_over:
            if t.net_s is not None:
                out.setdefault(f.facts.kind, []).append(t.net_s)
    return {k: sorted(v) for k, v in sorted(out.items())}


def kind_totals(results: Sequence[RunResult]) -> dict[str, dict[str, float | int | None]]:
    """Takeovers over the campaign by the fault that caused them: the targets differ (SIGKILL
    p99 5 s, SIGTERM 1 s; a pause or a partition waits for the Lease by design)."""
    kinds: dict[str, list[float]] = {}
    for r in results:
        for k, v in r.by_kind.items():
            kinds.setdefault(k, []).extend(v)
    return {
        k: {"takeovers": len(v), "p50_s": _r(_pct(v, 50)), "p99_s": _r(_pct(v, 99)),
            "max_s": _r(max(v))}
        for k, v in sorted(kinds.items())
    }  # fmt: skip


def kind_rows(results: Sequence[RunResult]) -> list[str]:
    return [
        f"{'takeover':>10}  after {k:<38} {t['takeovers']:>4} taken, p50 {_s(t['p50_s'])}"
        f" p99 {_s(t['p99_s'])} max {_s(t['max_s'])}"
        for k, t in kind_totals(results).items()
    ]


def _pct(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    return statistics.quantiles(ordered, n=100, method="inclusive")[int(q) - 1]


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


HEAD = (
    f"{'seed':>10}  {'faults':<44} {'lost':>4} {'late':>4} {'dbl':>3} {'over':>4} {'under':>5}"
    f" {'missed':>6} {'nobody':>6} {'tk p50':>6} {'tk p99':>6} {'tk max':>6} {'raw max':>7}"
    f" {'live':>4}"
    f" {'fenced':>6}  verdict"
)


def row(r: RunResult) -> str:
    t = r.takeovers
    verdict = (
        f"ABORTED ({r.aborted[:60]})"
        if r.aborted
        else ("PASS" if r.ok else "FAIL: " + ", ".join(r.failed_checks))
    )
    return (
        f"{r.seed:>10}  {r.faults[:44]:<44} {r.lost:>4} {r.late:>4} {r.doubled:>3} {r.over:>4}"
        f" {r.under:>5} {r.missed:>6} {r.nobody_up:>6} {_s(_pct(t, 50)):>6} {_s(_pct(t, 99)):>6}"
        f" {_s(max(t) if t else None):>6} {_s(max(r.raw_takeovers, default=None)):>7}"
        f" {r.live_takeovers:>4} {r.fenced:>6}  {verdict}"
    )


def total_row(results: Sequence[RunResult]) -> str:
    t = [x for r in results for x in r.takeovers]
    broken = sum(1 for r in results if r.broken)
    passed = sum(1 for r in results if r.ok and not r.aborted)
    label = f"{len(results)} runs"
    return (
        f"{'total':>10}  {label:<44} {sum(r.lost for r in results):>4}"
        f" {sum(r.late for r in results):>4} {sum(r.doubled for r in results):>3}"
        f" {sum(r.over for r in results):>4} {sum(r.under for r in results):>5}"
        f" {sum(r.missed for r in results):>6} {sum(r.nobody_up for r in results):>6}"
        f" {_s(_pct(t, 50)):>6} {_s(_pct(t, 99)):>6}"
        f" {_s(max(t) if t else None):>6}"
        f" {_s(max((x for r in results for x in r.raw_takeovers), default=None)):>7}"
        f" {sum(r.live_takeovers for r in results):>4}"
        f" {sum(r.fenced for r in results):>6}  {passed} PASS, {broken} broken"
    )


def silence_line(docs: Mapping[int, dict[str, Any]]) -> str:
    """Which runs have a silent replica (a pause or a partition): the campaign's aim."""
    without = [str(s) for s, doc in docs.items() if not silenced(doc)]
    have = len(docs) - len(without)
    rest = f"; without: {', '.join(without)}" if without else ""
    return f"pause or partition in {have}/{len(docs)} runs{rest}"


def run_limit_s(doc: dict[str, Any]) -> float:
    """How long one run may take in all: build, storm and faults, the drill's wait, judging."""
    s = scenario_mod.parse(doc)
    last = max(
        [n.at_s + n.spread_s for n in s.notices]
        + [f.at_s + (f.for_s or 0.0) + (f.restart_s or 0.0) + (f.grace_s or 0.0) for f in s.faults]
    )
    term = max((f.the_grace_s for f in s.faults if f.kind.value == "term"), default=0.0)
    return BUILD_BOUND_S + last + term + s.expect.timeout_s + s.expect.settle_s + JUDGE_BOUND_S


async def _one(
    seed: int, doc: dict[str, Any], out_dir: Path, limit_s: float, say: Any
) -> RunResult:
    from chaos.drill import run as drill
    from chaos.drill.verdict.render import render, to_json

    parsed = scenario_mod.parse(doc, origin=f"failover-{seed}")
    faults = ", ".join(fault_label(f) for f in doc["faults"])
    t0 = time.monotonic()
    try:
        async with asyncio.timeout(limit_s):
            verdict = await drill.run_drill(parsed, progress=drill.Progress(sys.stderr))
    except TimeoutError:
        return RunResult(seed, faults, aborted=f"no verdict in {limit_s:.0f}s", seconds=limit_s)
    except Exception as e:  # a drill that could not run: the campaign says so and goes on
        say(f"run {seed}: {type(e).__name__}: {e}")
        say("".join(traceback.format_exception(e)).rstrip())
        return RunResult(
            seed, faults, aborted=f"{type(e).__name__}: {e}", seconds=time.monotonic() - t0
        )
    (out_dir / f"{seed}.json").write_text(json.dumps(to_json(verdict), indent=2) + "\n")
    (out_dir / f"{seed}.txt").write_text(render(verdict, all_rows=True) + "\n")
    return result_of(seed, faults, verdict, time.monotonic() - t0)


def _rerun(seed: int, args: argparse.Namespace) -> str:
    extra = ""
    if args.kinds != ",".join(KINDS):
        extra += f" --kinds {args.kinds}"
    if args.sources != ",".join(SOURCES):
        extra += f" --sources {args.sources}"
    return f"python -m chaos.bench.failover.run --runs 1 --seed {seed}{extra}"


async def campaign(args: argparse.Namespace) -> int:
    from chaos import stack as stackenv

    kinds = _names(args.kinds, KINDS, "--kinds")
    sources = _names(args.sources, SOURCES, "--sources")
    seeds = run_seeds(args.seed, args.runs)
    out = Path(args.out)
    out_dir = out.parent / "failover"
    out_dir.mkdir(parents=True, exist_ok=True)
    docs = {s: generate(s, kinds=kinds, sources=sources) for s in seeds}
    for s, doc in docs.items():
        (out_dir / f"{s}.yaml").write_text(
            f"# {_rerun(s, args)}\n" + yaml.safe_dump(doc, sort_keys=False)
        )

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    say(
        f"bench-failover: {len(seeds)} run(s), campaign seed {args.seed};"
        f" scenarios in {out_dir}/<seed>.yaml"
    )
    if args.dry_run:
        for s, doc in docs.items():
            labels = ", ".join(fault_label(f) for f in doc["faults"])
            print(f"{s:>10}  {labels}  ({doc['description']})")
        print(silence_line(docs))
        return EXIT_OK
    stackenv.load()  # StackNotRunning before the first run, not in it
    results: list[RunResult] = []
    print(HEAD, flush=True)
    for i, s in enumerate(seeds):
        limit = args.run_timeout or run_limit_s(docs[s])
        say(f"== run {i + 1}/{len(seeds)}: seed {s} (at most {limit:.0f}s)")
        r = await _one(s, docs[s], out_dir, limit, say)
        results.append(r)
        print(row(r), flush=True)
        _write(out, args, seeds, results)
    print(total_row(results), flush=True)
    print(silence_line({r.seed: docs[r.seed] for r in results}), flush=True)
    for line in kind_rows(results):
        print(line, flush=True)
    broken = [r for r in results if r.broken]
    for r in broken:
        print(f"rerun: {_rerun(r.seed, args)}   (scenario {out_dir / f'{r.seed}.yaml'})")
    return EXIT_FAILED if broken else EXIT_OK


def _write(out: Path, args: argparse.Namespace, seeds: Sequence[int], rs: list[RunResult]) -> None:
    t = [x for r in rs for x in r.takeovers]
    doc = {
        "campaign_seed": args.seed,
        "runs_planned": len(seeds),
        "kinds": args.kinds.split(","),
        "sources": args.sources.split(","),
        "runs": [
            {
                "seed": r.seed,
                "scenario": str(out.parent / "failover" / f"{r.seed}.yaml"),
                "rerun": _rerun(r.seed, args),
                "faults": r.faults,
                "ok": r.ok,
                "broken": r.broken,
                "aborted": r.aborted or None,
                "notices": r.notices,
                "lost": r.lost,
                "late": r.late,
                "doubled": r.doubled,
                "over_charged": r.over,
                "under_charged": r.under,
                "deadlines_missed": r.missed,
                "late_while_nobody_up": r.nobody_up,
                "takeovers": len(r.takeovers),
                "takeover_p50_s": _r(_pct(r.takeovers, 50)),
                "takeover_p99_s": _r(_pct(r.takeovers, 99)),
                "takeover_max_s": _r(max(r.takeovers) if r.takeovers else None),
                "takeover_raw_p99_s": _r(_pct(r.raw_takeovers, 99)),
                "takeover_raw_max_s": _r(max(r.raw_takeovers, default=None)),
                "live_takeovers": r.live_takeovers,
                "fenced_actions": r.fenced,
                "gave_up": r.gave_up,
                "failed_checks": r.failed_checks,
                "seconds": round(r.seconds, 1),
            }
            for r in rs
        ],
        "total": {
            "runs": len(rs),
            "passed": sum(1 for r in rs if r.ok and not r.aborted),
            "broken": sum(1 for r in rs if r.broken),
            "lost": sum(r.lost for r in rs),
            "late": sum(r.late for r in rs),
            "doubled": sum(r.doubled for r in rs),
            "over_charged": sum(r.over for r in rs),
            "under_charged": sum(r.under for r in rs),
            "deadlines_missed": sum(r.missed for r in rs),
            "late_while_nobody_up": sum(r.nobody_up for r in rs),
            "takeovers": len(t),
            "takeover_p50_s": _r(_pct(t, 50)),
            "takeover_p99_s": _r(_pct(t, 99)),
            "takeover_max_s": _r(max(t) if t else None),
            "takeover_raw_p99_s": _r(_pct([x for r in rs for x in r.raw_takeovers], 99)),
            "takeover_raw_max_s": _r(max((x for r in rs for x in r.raw_takeovers), default=None)),
            "live_takeovers": sum(r.live_takeovers for r in rs),
            "fenced_actions": sum(r.fenced for r in rs),
            "takeover_by_fault_kind": kind_totals(rs),
        },
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def _names(value: str, allowed: Sequence[str], flag: str) -> tuple[str, ...]:
    names = tuple(v.strip() for v in value.split(",") if v.strip())
    bad = [n for n in names if n not in allowed]
    if bad or not names:
        raise ScenarioError(
            f"{flag}: {', '.join(bad) or 'empty'}; one or more of {','.join(allowed)}"
        )
    return names


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m chaos.bench.failover.run", description=__doc__.splitlines()[0]
    )
    p.add_argument("--runs", type=int, default=DEFAULT_RUNS, help=f"drills ({DEFAULT_RUNS})")
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help="the campaign seed (default: a random one, printed); run 0 uses it as its own",
    )
    p.add_argument("--out", default="out/bench-failover.json", help="the JSON report")
    p.add_argument("--kinds", default=",".join(KINDS), help="fault kinds to draw from")
    p.add_argument("--sources", default=",".join(SOURCES), help="notice sources to draw from")
    p.add_argument(
        "--run-timeout", type=float, default=None, help="seconds per run (default: from its plan)"
    )
    p.add_argument(
        "--dry-run", action="store_true", help="write and list the scenarios, run nothing"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    from chaos import stack as stackenv

    args = parser().parse_args(argv)
    if args.runs < 1:
        print("campaign: --runs must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1, 2**31)
    try:
        return asyncio.run(campaign(args))
    except (ScenarioError, stackenv.StackNotRunning) as e:
        print(f"campaign: {e}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
