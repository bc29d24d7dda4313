"""bench-soak (chaos.bench.soak): its scenario, its RSS and GCE claim figures."""

from __future__ import annotations

import itertools

import pytest

from chaos.bench import soak as bench_soak
from chaos.drill import plan as planning
from chaos.drill.scenario import FaultKind, ScenarioError, Source


@pytest.mark.parametrize("minutes", [1.0, 4.0, 10.0, 30.0])
def test_the_soak_is_valid_every_source_steady_every_fault_kind_in_turn(minutes: float) -> None:
    doc = bench_soak.generate(minutes=minutes, interval_s=15.0)
    s = bench_soak.check(doc)
    plan = planning.plan(s, run_id="unit")
    assert s.reclaimd.replicas == 2
    # One notice per node of its source's pool, each node with gangs of its own only.
    for source in (Source.EC2_SQS, Source.GKE_PUBSUB, Source.KAFKA):
        mine = [n for n in plan.notices if n.source is source]
        assert len({n.node for n in mine}) == len(mine) >= 1
        times = sorted(g.at_s for g in s.notices if g.source is source)
        assert all(b - a == pytest.approx(15.0, abs=0.2) for a, b in itertools.pairwise(times))
        assert times[-1] <= minutes * 60 - bench_soak.TAIL_S + 0.1
    for n in plan.notices:
        gangs = plan.gangs_on(n.node or "")
        assert gangs and all(set(g.nodes) == {n.node} for g in gangs)
    # Every kind, each once, in the order of TURNS, spread over the run.
    assert [f.kind for f in s.faults] == [FaultKind(t["kind"]) for t in bench_soak.TURNS.values()]
    assert set(FaultKind) == {f.kind for f in s.faults}
    at = [f.at_s for f in s.faults]
    assert at == sorted(at) and at[-1] < minutes * 60
    assert {f.replica for f in s.faults if f.replica is not None} == {0, 1}
    assert not any(f.for_good for f in s.faults)  # both replicas stay for the whole soak


def test_kinds_pick_the_faults_and_a_notice_on_no_gang_is_refused() -> None:
    doc = bench_soak.generate(minutes=2, kinds=("pause", "stop_kafka"))
    assert [f["kind"] for f in doc["faults"]] == ["pause", "stop_kafka"]
    bench_soak.check(doc)
    doc["notices"][0]["target"] = {"nodes": ["b-0"]}
    doc["cluster"]["pools"].append({"name": "b", "count": 1, "gpus": 8})
    with pytest.raises(ScenarioError, match="no gang on b-0"):
        bench_soak.check(doc)


def test_rss_is_summed_up_per_process_a_restart_apart() -> None:
    samples = [
        {"t_s": 0.0, "replica": 0, "name": "reclaimd-0", "pid": 10, "rss_mb": 100.0},
        {"t_s": 5.0, "replica": 0, "name": "reclaimd-0", "pid": 10, "rss_mb": 130.0},
        {"t_s": 10.0, "replica": 0, "name": "reclaimd-0", "pid": 10, "rss_mb": 120.0},
        {"t_s": 15.0, "replica": 0, "name": "reclaimd-0", "pid": 11, "rss_mb": 90.0},
        {"t_s": 0.0, "replica": 1, "name": "reclaimd-1", "pid": 12, "rss_mb": 101.0},
    ]
    got = bench_soak.rss_summary(samples)
    assert list(got) == ["reclaimd-0 pid 10", "reclaimd-0 pid 11", "reclaimd-1 pid 12"]
    first = got["reclaimd-0 pid 10"]
    assert (first["samples"], first["first_mb"], first["peak_mb"], first["last_mb"]) == (
        3,
        100.0,
        130.0,
        120.0,
    )
    assert (first["from_s"], first["to_s"]) == (0.0, 10.0)
    assert got["reclaimd-0 pid 11"]["peak_mb"] == 90.0


def _notice(
    label: str, sent: str, claimed: str | None, met: bool | None = True
) -> dict[str, object]:
    return {
        "label": label,
        "notice_id": label,
        "source": "gke-pubsub",
        "sent_at": sent,
        "claimed_at": claimed,
        "deadline_met": met,
    }


def test_gce_claims_name_the_faults_under_way_at_the_send() -> None:
    drill = {
        "faults": [
            {
                "fault": "restart_apiserver@60s",
                "started_at": "2026-12-06T10:01:00Z",
                "ended_at": "2026-12-06T10:01:05Z",
            }
        ],
        "notices": [
            _notice("g#0", "2026-12-06T10:00:30Z", "2026-12-06T10:00:30.200Z"),
            _notice("g#1", "2026-12-06T10:01:02Z", "2026-12-06T10:01:06.500Z"),
            # sent 9 s after the outage ended: still under way (a reconnect takes seconds)
            _notice("g#2", "2026-12-06T10:01:14Z", "2026-12-06T10:01:14.300Z"),
            _notice("g#3", "2026-12-06T10:02:00Z", "2026-12-06T10:02:01.500Z"),
            _notice("g#4", "2026-12-06T10:03:00Z", None, met=False),
            {**_notice("s#0", "2026-12-06T10:00:00Z", "2026-12-06T10:00:09Z"), "source": "ec2-sqs"},
        ],
    }
    rows = bench_soak.gce_claims(drill)
    assert [(r["label"], r["claim_s"], r["faults_under_way"]) for r in rows] == [
        ("g#0", 0.2, []),
        ("g#1", 4.5, ["restart_apiserver@60s"]),
        ("g#2", 0.3, ["restart_apiserver@60s"]),
        ("g#3", 1.5, []),
        ("g#4", None, []),
    ]
    summary = bench_soak.gce_summary(rows)
    assert (summary["notices"], summary["within_1s"], summary["windows_missed"]) == (5, 2, 1)
    assert (summary["no_fault_under_way"], summary["no_fault_within_1s"]) == (3, 1)
    assert summary["no_fault_max_s"] == 1.5 and summary["max_s"] == 4.5
    assert [r["label"] for r in summary["over_1s"]] == ["g#1", "g#3", "g#4"]
