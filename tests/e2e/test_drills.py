"""Chaos drills on the real stack: every shipped scenario that can pass does, and a scenario
that cannot be met makes the verdict (and ``reclaimd drill run``) fail.

A drill builds its own kwok fleet, fake trainers and reclaimd processes, injects through the
real transports and judges from ground truth (``chaos.drill.verdict``); these tests only assert the
verdict, and print its table when it is not the expected one.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from chaos.drill import run as drill
from chaos.drill import scenario
from chaos.drill.verdict.render import render

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = REPO / "chaos" / "scenarios"

# Shipped scenarios whose verdict must be PASS on today's reclaimd (the storm at bench size;
# `make demo` runs the full one).
PASSING = [
    "spot-single",
    "spot-az-storm-bench",
    "mixed-duplicates-garbage",
    "gke-preempt-30s",
    "aks-spot-evictions",
    "kafka-notices",
    "storm-two-replicas",  # a gang split across replicas is charged once (its Lease)
    "kueue-reclaim",
    "spot-storm-restart",  # gangs that come back: each charged its restart overhead once
]

IMPOSSIBLE: dict[str, Any] = {
    "name": "impossible",
    "description": "3 s window, trainers that hang, a PDB that forbids any eviction, respect-pdb",
    "seed": 3,
    "cluster": {"pools": [{"name": "a", "count": 2}]},
    "gangs": [
        {
            "name": "stuck",
            "ranks": 2,
            "pdb_max_unavailable": 0,
            "checkpoint": {"hang": 1.0, "timeout_s": 60},
        }
    ],
    "notices": [{"source": "ec2-sqs", "target": {"nodes": ["a-0"]}}],
    "reclaimd": {"windows": {"ec2_spot_s": 3}, "policy": {"eviction": "respect-pdb"}},
    "expect": {"timeout_s": 30},
}


def _quiet() -> drill.Progress:
    return drill.Progress(quiet=True)


@pytest.mark.parametrize("name", PASSING)
async def test_shipped_scenario_passes(stack: Any, name: str) -> None:
    verdict = await drill.run_drill(scenario.load(SCENARIOS / f"{name}.yaml"), progress=_quiet())
    assert verdict.ok, render(verdict, all_rows=True)
    # a pass must rest on something: notices handled and, for these, gangs charged
    assert verdict.notices and all(n.traced for n in verdict.notices)
    assert verdict.gangs and all(g.events == 1 for g in verdict.gangs)
    if verdict.restarts:  # and a restart charged is a restart measured: Ready after receipt
        assert all(r.events == 1 and (r.seconds or 0) > 0 for r in verdict.restarts)


def test_every_shipped_scenario_is_accounted_for() -> None:
    loaded = {p.stem: scenario.load(p) for p in SCENARIOS.glob("*.yaml")}
    # scenarios with faults: tests/e2e/test_fault_drills.py accounts for them
    shipped = {stem for stem, s in loaded.items() if not s.faults}
    named = {loaded[s].name for s in shipped}
    # the full storm runs in make demo, the 1,000-node ones in make bench-storm,
    # bench-storm-1000, bench-storm-kafka and bench-storm-pubsub, the 600-node shapes in
    # python -m chaos.bench.shapes
    benches = {
        "spot-az-storm-1000",
        "spot-storm-1000-notices",
        "kafka-storm-1000",
        "pubsub-storm-1000",
        "bench-600-plain",
        "bench-600-gang",
    }
    # game days (tests/e2e/test_gameday.py) run against the Helm-installed release
    gamedays = {"gameday-spot-storm", "gameday-gce-storm", "gameday-kueue-reclaim"}
    assert shipped == set(PASSING) | {"spot-az-storm"} | benches | gamedays
    assert len(named) == len(shipped)  # scenario names are unique too


async def test_an_impossible_scenario_fails_the_verdict(stack: Any) -> None:
    verdict = await drill.run_drill(scenario.parse(IMPOSSIBLE), progress=_quiet())
    failed = {c.name for c in verdict.checks if c.required and not c.ok}
    # it fails for the reasons that make it impossible, and for no other
    assert failed == {"every deadline met", "evictions done"}, render(verdict)
    assert not verdict.ok
    (gang,) = verdict.gangs
    assert gang.events == 1 and gang.deadline_met is False and gang.pods_left == 2


async def test_the_command_exits_1_and_writes_the_report(stack: Any, tmp_path: Path) -> None:
    path = tmp_path / "impossible.yaml"
    path.write_text(yaml.safe_dump(IMPOSSIBLE))
    out = tmp_path / "report.json"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "chaos.drill.run", "drill", "run", str(path),
        "--json", str(out),
        cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    stdout, stderr = await proc.communicate()
    assert proc.returncode == 1, stderr.decode()[-2000:]
    assert "== verdict: FAIL" in stdout.decode()
    assert "sent ec2-sqs#0" in stderr.decode()  # the progress lines
    doc = json.loads(out.read_text())
    assert doc["ok"] is False
    (notice,) = doc["notices"]
    assert notice["deadline_met"] is False
    for key in ("source", "kind", "target", "deadline", "claimed_at", "cordoned_at",
                "all_signaled_at", "drained_at"):  # fmt: skip
        assert notice[key] is not None, key
    (gang,) = doc["gangs"]
    low, high = gang["expected_gpu_seconds"]
    assert low - 0.05 <= gang["ledger_gpu_seconds"] <= high + 0.05


async def test_a_bad_scenario_exits_2_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**IMPOSSIBLE, "gangs": [{"name": "x", "rnaks": 2}]}))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "chaos.drill.run", "drill", "run", str(path),
        cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, stderr = await proc.communicate()
    assert proc.returncode == 2
    lines = stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "gangs.0.ranks: Field required" in lines[0], lines
