"""Fault drills on the real stack: a storm with a replica killed, paused, SIGTERMed (with a
successor: a rolling upgrade), cut off from the apiserver or replaced, faults on both replicas
at once, Kafka stopped, the apiserver, moto or the Pub/Sub emulator restarted (``faults:``,
docs/drills.md).

The verdict keeps every check of a drill (nothing lost, nothing doubled, GPU-seconds from
ground truth, deadlines) and adds what each fault cost. A scenario is listed in
``FAULT_PASSING`` only once its verdict is PASS on today's reclaimd; the others are in
``FAULTS_NOT_YET`` with the guarantee that is missing, and run by hand
(``reclaimd drill run chaos/scenarios/<name>.yaml``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from chaos.drill import run as drill
from chaos.drill import scenario
from chaos.drill.verdict.render import render

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = REPO / "chaos" / "scenarios"

FAULT_PASSING: list[str] = [
    "storm-kafka-outage",
    "storm-moto-restart",
    "gce-storm-pubsub-restart",
    "storm-pause-replica",
    "storm-apiserver-restart",
    "storm-fresh-disk-kafka-down",
    "storm-kill-replica",
    "storm-kill-restart",
    "storm-term-rolling",  # 3/3 runs PASS (2026-12-01)
    "storm-partition-replica",  # 3/3
    "storm-both-replicas-faults",  # 3/3
    "kueue-reclaim-kill",  # 3/3
    "gce-kill-30s",  # 3/3 with Pub/Sub slots (2026-12-02)
    # Seeds of make bench-failover that found a bug, fixed since (the generated scenario as the
    # campaign wrote it; `python -m chaos.bench.failover.run --runs 1 --seed N` reruns it).
    "failover-1059485652",  # 2/2 after the fixes of 2026-12-02
    "failover-1135209167",  # 3/3
    "failover-820738344",  # 3/3
    "failover-2258512585",  # 3/3 with held notices and the pod snapshot (2026-12-02)
    "failover-4253230685",  # 3/3 with the ack hand-off, /reach and the leader fix (2026-12-02)
    # bench-failover --seed 20261205 (2026-12-02), each passing when rerun after its fix:
    "failover-3932946063",  # SIGTERM hands over only to a peer alive now
    "failover-631573728",  # the spans go out before each ledger event
    "failover-4020099555",  # the same
    # issue 37: the claim's holder SIGSTOPped before its ask; its gang still gets most of
    # the 30 s window (silence told within seconds, not after the 20 s claim lease)
    "gce-silent-holder-30s",
]
# Not PASS every run yet: the scenario, and the guarantee that is missing (reclaimd's, not the
# rig's; docs/drills.md has the figures).
FAULTS_NOT_YET: dict[str, str] = {}


def test_every_fault_scenario_is_accounted_for() -> None:
    loaded = {p.stem: scenario.load(p) for p in SCENARIOS.glob("*.yaml")}
    with_faults = {stem for stem, s in loaded.items() if s.faults}
    assert with_faults == set(FAULT_PASSING) | set(FAULTS_NOT_YET)
    assert not set(FAULT_PASSING) & set(FAULTS_NOT_YET)
    assert all(reason for reason in FAULTS_NOT_YET.values())


@pytest.mark.parametrize("name", FAULT_PASSING)
async def test_fault_scenario_passes(stack: Any, name: str) -> None:
    loaded = scenario.load(SCENARIOS / f"{name}.yaml")
    verdict = await drill.run_drill(loaded, progress=drill.Progress(quiet=True))
    assert verdict.ok, render(verdict, all_rows=True)
    # the fault happened and was measured: a pass must not rest on a fault that missed
    assert verdict.faults and all(not f.facts.error for f in verdict.faults)
    assert verdict.gangs and all(g.events == 1 for g in verdict.gangs)
    assert verdict.gave_up is None  # a pass is never a drill that stopped waiting
    for f in verdict.faults:
        if f.facts.kind == "term":  # the check says it exited by itself; here: it was timed
            assert f.facts.exit_code == 0 and f.exit_s is not None and not f.facts.sigkilled
        if f.facts.kind == "partition":  # it cut a replica that was talking to the apiserver
            assert f.facts.connections_cut > 0 and f.facts.ended_at is not None
    if loaded.expect.min_ask_budget is not None:  # the silence struck a holder with work held
        assert any(c.name.startswith("a silent holder's gangs") for c in verdict.checks)
        assert all(f.facts.held for f in verdict.faults)
