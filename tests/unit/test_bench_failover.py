"""bench-failover (chaos.bench.failover): seeds, generated scenarios, rows, exit status."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from chaos.bench.failover import run as failover
from chaos.bench.failover import scenario as failover_scenario
from chaos.drill import plan as planning
from chaos.drill import scenario

SEEDS = failover_scenario.run_seeds(20261201, 60)


def test_run_seeds_start_with_the_campaign_seed_and_are_stable() -> None:
    seeds = failover_scenario.run_seeds(42, 5)
    assert seeds[0] == 42 and len(set(seeds)) == 5
    assert failover_scenario.run_seeds(42, 5) == seeds
    assert failover_scenario.run_seeds(42, 3) == seeds[:3]
    assert failover_scenario.run_seeds(43, 5)[1:] != seeds[1:]


def test_a_run_is_generated_from_its_seed_alone() -> None:
    # `--runs 1 --seed <a run's seed>` reruns that run: run 0 of a campaign seeded with it
    seed = failover_scenario.run_seeds(99, 4)[3]
    again = failover_scenario.run_seeds(seed, 1)[0]
    assert failover_scenario.generate(seed) == failover_scenario.generate(again)
    assert failover_scenario.generate(seed) != failover_scenario.generate(seed + 1)


@pytest.mark.parametrize("seed", SEEDS[:60])
def test_every_generated_scenario_is_valid_and_in_bounds(seed: int) -> None:
    doc = failover_scenario.generate(seed)
    s = scenario.parse(doc)
    plan = planning.plan(s, run_id="unit")
    assert failover_scenario.MIN_NODES <= len(plan.nodes) <= failover_scenario.MAX_NODES
    assert all(1 <= len(g.ranks) <= 8 for g in plan.gangs)
    assert s.reclaimd.replicas == 2 and 1 <= len(s.faults) <= 3
    touched = {g.name for n in plan.notices for g in plan.gangs_on(n.node or "")}
    touched |= {n.gang for n in plan.notices if n.gang}
    assert touched, "a run whose notices touch no gang rehearses nothing"
    # one replica always comes back, nothing happens to a replica gone for good
    gone = {f.replica for f in s.faults if f.for_good}
    assert len(gone) <= 1
    storm_end = max(n.at_s + n.spread_s for n in s.notices)
    for f in s.faults:
        assert f.at_s <= storm_end + 2.0  # inside the storm (or just after its last send)
        if f.kind is scenario.FaultKind.PAUSE:
            low, high = failover_scenario.PAUSE_S
            assert f.for_s is not None and low <= f.for_s <= high
    sources = {n.source.value for n in s.notices}
    assert sources <= set(failover_scenario.SOURCES)
    assert math.isfinite(failover.run_limit_s(doc))


def test_the_mix_covers_every_kind_and_source() -> None:
    docs = [failover_scenario.generate(s) for s in SEEDS]
    labels = {
        failover_scenario.fault_label(f).split(" ")[0].split("@")[0]
        for d in docs
        for f in d["faults"]
    }
    assert labels == {
        "kill", "kill+restart", "fresh_disk", "pause", "term", "term+successor", "partition",
        "stop_kafka", "restart_apiserver",
    }  # fmt: skip
    assert {n["source"] for d in docs for n in d["notices"]} == set(failover_scenario.SOURCES)
    assert any(g.get("pdb_max_unavailable") is not None for d in docs for g in d["gangs"])
    assert any(len(g.get("pools", ())) > 1 for d in docs for g in d["gangs"])  # across pools
    both = [d for d in docs if {f.get("replica") for f in d["faults"]} >= {0, 1}]
    assert both, "faults on both replicas at once"


def test_most_runs_silence_a_replica_and_every_kind_still_appears() -> None:
    # issue 37: a pause or a partition in most runs of a 20-run campaign, every campaign
    for campaign in (20261201, 20261205, 7):
        docs = [failover_scenario.generate(s) for s in failover_scenario.run_seeds(campaign, 20)]
        assert sum(failover_scenario.silenced(d) for d in docs) >= 14, campaign
    docs = [failover_scenario.generate(s) for s in SEEDS]
    assert 0.7 <= sum(failover_scenario.silenced(d) for d in docs) / len(docs) < 1.0
    others = [f for d in docs for f in d["faults"] if f["kind"] not in ("pause", "partition")]
    assert len(others) >= len(SEEDS) // 3  # the other kinds are not crowded out
    # pauses on both sides of the claim lease: taken over, or back before anyone had to
    pauses = [f["for_s"] for d in docs for f in d["faults"] if f["kind"] == "pause"]
    assert min(pauses) < failover_scenario.CLAIM_LEASE_S < max(pauses)
    assert min(pauses) < 8.0 and max(pauses) > 25.0


def test_silence_line_names_the_runs_without_one() -> None:
    docs = {s: failover_scenario.generate(s) for s in failover_scenario.run_seeds(20261205, 20)}
    without = [s for s, d in docs.items() if not failover_scenario.silenced(d)]
    line = failover.silence_line(docs)
    assert line.startswith(f"pause or partition in {20 - len(without)}/20 runs")
    assert all(str(s) in line for s in without)
    assert failover_scenario.silenced({"faults": [{"kind": "partition"}]})
    assert not failover_scenario.silenced({"faults": [{"kind": "kill"}, {"kind": "term"}]})


def test_kinds_and_sources_can_be_narrowed() -> None:
    for seed in SEEDS[:20]:
        doc = failover_scenario.generate(seed, kinds=["partition", "pause"], sources=["ec2-sqs"])
        assert {f["kind"] for f in doc["faults"]} <= {"partition", "pause"}
        assert {n["source"] for n in doc["notices"]} == {"ec2-sqs"}
        loud = failover_scenario.generate(seed, kinds=["kill", "stop_kafka"])
        assert {f["kind"] for f in loud["faults"]} <= {"kill", "stop_kafka"}


def _result(**kw: Any) -> failover.RunResult:
    return failover.RunResult(seed=kw.pop("seed", 7), faults="kill r0@3", **kw)


def test_rows_and_the_total() -> None:
    a = _result(ok=True, notices=10, takeovers=[1.0, 2.0, 3.0])
    b = _result(seed=8, lost=1, late=2, missed=1, takeovers=[21.0], live_takeovers=1, fenced=2,
                failed_checks=["ledger: one event per affected gang"])  # fmt: skip
    c = _result(seed=9, aborted="no verdict in 600s")
    assert not a.broken and b.broken and c.broken
    assert _result(over=1).broken and _result(under=1).broken and _result(doubled=1).broken
    assert not _result(missed=3, live_takeovers=2, late=1).broken  # figures, not failures
    assert failover.row(a).split()[:2] == ["7", "kill"] and "PASS" in failover.row(a)
    assert "FAIL: ledger" in failover.row(b) and "ABORTED (no verdict" in failover.row(c)
    total = failover.total_row([a, b, c])
    assert total.startswith("     total  3 runs") and "1 PASS, 2 broken" in total
    cols = failover.HEAD.split()
    assert cols[:3] == ["seed", "faults", "lost"] and "live" in cols and "fenced" in cols


def test_takeovers_are_totalled_by_the_fault_kind_that_caused_them() -> None:
    a = _result(by_kind={"kill": [0.5, 1.0], "pause": [20.0]})
    b = _result(seed=8, by_kind={"kill": [3.0], "term": [0.2]})
    totals = failover.kind_totals([a, b])
    assert list(totals) == ["kill", "pause", "term"]
    assert totals["kill"]["takeovers"] == 3 and totals["kill"]["max_s"] == 3.0
    assert totals["pause"]["p99_s"] == 20.0
    kill, pause, term = failover.kind_rows([a, b])
    assert "after kill" in kill and "3 taken" in kill and "max 3.00" in kill
    assert "after pause" in pause and "after term" in term


def test_dry_run_writes_each_scenario_for_shipping(tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "bench-failover.json"
    code = failover.main(["--runs", "3", "--seed", "5", "--out", str(out), "--dry-run"])
    assert code == 0
    files = sorted((tmp_path / "failover").glob("*.yaml"))
    assert [f.stem for f in files] == sorted(str(s) for s in failover_scenario.run_seeds(5, 3))
    for f in files:
        text = f.read_text()
        assert text.startswith(f"# python -m chaos.bench.failover.run --runs 1 --seed {f.stem}")
        scenario.load(f)  # a generated run is a scenario `reclaimd drill run` takes as is
        assert yaml.safe_load(text) == failover_scenario.generate(int(f.stem))
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 4 and lines[-1].startswith("pause or partition in ")


def test_bad_arguments_exit_2(tmp_path: Path, capsys: Any) -> None:
    out = str(tmp_path / "x.json")
    assert failover.main(["--runs", "0", "--out", out]) == 2
    assert failover.main(["--kinds", "kill,nuke", "--out", out, "--dry-run"]) == 2
    assert "--kinds: nuke" in capsys.readouterr().err


def test_the_report_has_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    args = failover.parser().parse_args(["--seed", "3", "--out", str(out)])
    failover._write(out, args, [3, 4], [_result(seed=3, ok=True, takeovers=[1.5, 2.5])])
    doc = json.loads(out.read_text())
    run = doc["runs"][0]
    assert run["rerun"] == "python -m chaos.bench.failover.run --runs 1 --seed 3"
    for key in ("lost", "late", "doubled", "over_charged", "under_charged", "deadlines_missed",
                "takeover_p50_s", "takeover_p99_s", "takeover_max_s", "live_takeovers",
                "fenced_actions", "gave_up"):  # fmt: skip
        assert key in run
        assert key in doc["total"] or key == "gave_up"
    assert doc["total"]["takeover_max_s"] == 2.5 and doc["runs_planned"] == 2
