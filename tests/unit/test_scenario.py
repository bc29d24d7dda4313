"""Drill scenarios (format, validation, plan) and the drill's verdict logic, without a stack."""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from chaos.drill import plan as planning
from chaos.drill import scenario
from chaos.drill.scenario import ScenarioError, Source
from chaos.drill.verdict.evaluate import evaluate
from chaos.drill.verdict.facts import (
    Expectations,
    GangFacts,
    NoticeFacts,
    Observed,
    RankFacts,
    Save,
)
from chaos.drill.verdict.gpuseconds import expected_gpu_seconds
from chaos.drill.verdict.model import Verdict
from chaos.drill.verdict.render import render, to_json

SCENARIOS = Path(__file__).resolve().parents[2] / "chaos" / "scenarios"


def base() -> dict[str, Any]:
    return {
        "name": "t",
        "seed": 3,
        "cluster": {
            "pools": [
                {"name": "a", "count": 4, "zone": "us-east-2a"},
                {"name": "b", "count": 4, "zone": "us-east-2b"},
            ]
        },
        "gangs": [{"name": "llm", "count": 2, "ranks": 4}],
        "notices": [{"source": "ec2-sqs", "target": {"zone": "us-east-2a", "fraction": 0.5}}],
    }


def with_(path: str, value: Any, doc: dict[str, Any] | None = None) -> dict[str, Any]:
    """``base()`` with one value set at a dotted path (list indexes as numbers)."""
    d = copy.deepcopy(doc or base())
    node: Any = d
    parts = path.split(".")
    for p in parts[:-1]:
        node = node[int(p)] if isinstance(node, list) else node.setdefault(p, {})
    last = parts[-1]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return d


# --- every shipped scenario is valid -----------------------------------------------------------


@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_scenarios_load_and_plan(path: Path) -> None:
    s = scenario.load(path)
    plan = planning.plan(s, run_id="unit")
    assert plan.notices, "a drill without notices rehearses nothing"
    touched = {g.name for n in plan.notices for g in plan.gangs_on(n.node or "")}
    touched |= {n.gang for n in plan.notices if n.gang}
    assert touched, f"{path.stem}: no notice touches a gang"


def test_an_aks_drill_names_each_node_as_aks_and_its_metadata_service_do() -> None:
    """The node's providerID, the stand-in's VM and the notice's instance are one VM."""
    from chaos import fleet
    from chaos.standins.azure import compute_of
    from reclaimd import handlers

    plan = planning.plan(scenario.load(SCENARIOS / "aks-spot-evictions.yaml"), run_id="unit")
    assert {n.source for n in plan.notices} == {Source.AZURE_SCHEDULED}
    vms = set()
    for node in plan.nodes:
        spec = fleet.NodeSpec(
            name=node.name, instance_id=node.instance_id, zone=node.zone, sku=node.sku,
            purchase_option=node.purchase_option, cloud="azure", project=node.project,
        )  # fmt: skip
        compute = compute_of(node)
        assert handlers.instance_of(spec.provider_id) == compute.name == node.instance_id
        assert spec.provider_id.lower() == "azure://" + compute.resource_id.lower()
        assert (compute.location, compute.zone, compute.priority) == ("eastus", "1", "Spot")
        labels = fleet.node_body(spec)["metadata"]["labels"]
        assert labels["kubernetes.azure.com/scalesetpriority"] == "spot"
        vms.add(compute.name)
    assert len(vms) == len(plan.nodes)


def test_the_storm_is_storm_sized() -> None:
    plan = planning.plan(scenario.load(SCENARIOS / "spot-az-storm.yaml"), run_id="unit")
    assert len(plan.nodes) >= 200 and len(plan.gangs) >= 40
    bench = planning.plan(scenario.load(SCENARIOS / "spot-az-storm-bench.yaml"), run_id="unit")
    assert len(bench.nodes) < len(plan.nodes) and len(bench.gangs) < len(plan.gangs)


# --- validation: one line, naming the field ----------------------------------------------------


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (with_("gangs.0.rnaks", 3), "gangs.0.rnaks: Extra inputs are not permitted"),
        (with_("gangs.0.ranks", 0), "gangs.0.ranks: Input should be greater than or equal to 1"),
        (with_("gangs.0.name", "Bad_Name"), "gangs.0.name: must be 1-20 characters"),
        (with_("cluster.pools.0.cloud", "oci"), "cluster.pools.0.cloud: Input should be"),
        (with_("notices.0.source", "sns"), "notices.0.source: Input should be"),
        (with_("notices.0.kind", "preemption"), "kind 'preemption' is not one of"),
        (with_("notices.0.target", {"zone": "us-east-2a"}), "give one of fraction and count"),
        (
            with_("notices.0.target", {"nodes": ["a-0"], "count": 1}),
            "named targets take no fraction or count",
        ),
        (with_("gangs.0.checkpoint.fail", 1.5), "less than or equal to 1"),
        (
            with_("gangs.0.checkpoint", {"fail": 0.6, "hang": 0.6}),
            "fail + hang is more than every rank",
        ),
        (
            with_("gangs.0.checkpoint.ack_latency_s", {"uniform": [2, 1]}),
            "uniform: [lo, hi] needs 0 <= lo <= hi",
        ),
        (
            with_("gangs.0.checkpoint.ack_latency_s", {"lognormal": {"median": 1}}),
            "lognormal needs both median and sigma",
        ),
        (with_("gangs.0.checkpoint.ack_latency_s", True), "not a boolean"),
        (
            with_("reclaimd.windows", {"ec2_spot": 10}),
            "windows.ec2_spot: Extra inputs are not permitted",
        ),
        (with_("reclaimd.policy", {"eviction": "yolo"}), "policy.eviction: Input should be"),
        (with_("reclaimd.settings", {"sqs": {}}), "settings.sqs is set by the drill"),
        (with_("reclaimd.replicas", 9), "reclaimd.replicas: Input should be less than"),
        (with_("gangs.0.pools", ["zz"]), "gangs[0].pools: no pool 'zz'"),
        (with_("notices.0.malformed", 2, with_("notices.0.source", "imds")), "imds cannot carry"),
        (
            with_("notices.0.duplicates", 1, with_("notices.0.source", "imds")),
            "imds is polled: its repeats are built in",
        ),
        (
            with_("notices.0", {"source": "kueue", "target": {"nodes": ["a-0"]}}),
            "kueue notices target gangs, not nodes",
        ),
        (
            with_("notices.0", {"source": "ec2-sqs", "target": {"nodes": ["a-0"]}, "window_s": 3}),
            "window_s is for kafka notices",
        ),
        (with_("notices", []), "notices: Tuple should have at least 1 item"),
    ],
)
def test_bad_scenarios_fail_with_one_line(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError) as e:
        scenario.parse(doc)
    text = str(e.value)
    assert message in text
    assert "\n" not in text


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (
            with_("gangs.0.count", 3),
            "gangs[0]: gang llm-2 rank 0 does not fit: no node with 8 free GPUs",
        ),
        (
            with_("notices.0.target", {"nodes": ["a-9"]}),
            "notices[0].target.nodes: no node 'a-9'",
        ),
        (
            with_("notices.0.target", {"zone": "us-east-2a", "count": 5}),
            "count 5 is more than the 4 nodes that match",
        ),
        (with_("notices.0.target", {"zone": "eu-west-1a", "count": 1}), "no nodes match"),
        (
            with_("notices.0", {"source": "gke-pubsub", "target": {"nodes": ["a-0"]}}),
            "a-0 is a aws node; gke-pubsub notices need gce nodes",
        ),
        (
            with_("notices.0", {"source": "azure-scheduled", "target": {"nodes": ["a-0"]}}),
            "a-0 is a aws node; azure-scheduled notices need azure nodes",
        ),
        (
            with_("notices.0.malformed", 1, with_("notices.0.source", "azure-scheduled")),
            "azure-scheduled cannot carry",
        ),
        (
            with_("notices.0", {"source": "kueue", "target": {"gangs": ["llm-0"]}}),
            "llm-0 is not a kueue gang",
        ),
        (
            with_("gangs.0", {"name": "x", "ranks": 2, "placement": "explicit", "nodes": ["a-0"]}),
            "explicit placement needs one node per rank (2)",
        ),
    ],
)
def test_impossible_plans_fail_with_one_line(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError, match=None) as e:
        scenario.parse(doc)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_load_reports_yaml_errors_and_missing_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ScenarioError, match=r"bad.yaml: not valid YAML at line \d"):
        scenario.load(bad)
    with pytest.raises(ScenarioError, match="No such file"):
        scenario.load(tmp_path / "none.yaml")
    top = tmp_path / "list.yaml"
    top.write_text("- 1\n")
    with pytest.raises(ScenarioError, match="the top level must be a mapping"):
        scenario.load(top)


def test_per_node_sources_are_bounded() -> None:
    doc = with_("notices.0", {"source": "imds", "target": {"count": 8, "pool": "a"}})
    doc["cluster"]["pools"][0]["count"] = 10
    scenario.parse(doc)
    doc["notices"][0]["target"]["count"] = 9
    with pytest.raises(ScenarioError, match="at most 8 such nodes, not 9"):
        scenario.parse(doc)


# --- the plan ---------------------------------------------------------------------------------


def test_a_plan_depends_on_the_seed_only() -> None:
    s = scenario.parse(
        with_(
            "gangs.0.checkpoint",
            {"ack_latency_s": {"lognormal": {"median": 0.3, "sigma": 0.5}}, "fail": 0.25},
        )
    )
    one, two = planning.plan(s, run_id="r1"), planning.plan(s, run_id="r2")
    assert [g.ranks for g in one.gangs] == [g.ranks for g in two.gangs]
    assert [(n.node, n.send_at_s) for n in one.notices] == [
        (n.node, n.send_at_s) for n in two.notices
    ]
    # names are the run's own, so two runs never collide on the cluster
    assert {n.name for n in one.nodes}.isdisjoint({n.name for n in two.nodes})
    assert {n.instance_id for n in one.nodes}.isdisjoint({n.instance_id for n in two.nodes})
    reseeded = planning.plan(scenario.parse({**with_("seed", 4)}), run_id="r1")
    assert [n.node for n in reseeded.notices] != [n.node for n in one.notices] or [
        g.ranks for g in reseeded.gangs
    ] != [g.ranks for g in one.gangs]


def test_spread_puts_ranks_on_distinct_nodes_across_pools() -> None:
    plan = planning.plan(scenario.parse(base()), run_id="r")
    for g in plan.gangs:
        nodes = [r.node for r in g.ranks]
        assert len(set(nodes)) == len(nodes)
        assert {plan.node(n).pool for n in nodes} == {"a", "b"}  # interleaved: crosses zones
    used = Counter(r.node for g in plan.gangs for r in g.ranks)
    assert max(used.values()) == 1  # 8 GPUs per rank on 8-GPU nodes


def test_packed_fills_a_node_before_the_next() -> None:
    doc = with_("gangs.0", {"name": "small", "count": 3, "ranks": 3, "gpus_per_rank": 2,
                            "placement": "packed", "pools": ["b"]})  # fmt: skip
    plan = planning.plan(scenario.parse(doc), run_id="r")
    per_node = Counter(r.node for g in plan.gangs for r in g.ranks)
    assert per_node == {"b-0": 4, "b-1": 4, "b-2": 1}


def test_explicit_placement_and_capacity() -> None:
    doc = with_(
        "gangs",
        [
            {"name": "x", "ranks": 2, "gpus_per_rank": 4, "placement": "explicit",
             "nodes": ["a-0", "a-0"]},
            {"name": "y", "ranks": 1, "gpus_per_rank": 1, "placement": "explicit",
             "nodes": ["a-0"]},
        ],
    )  # fmt: skip
    with pytest.raises(ScenarioError, match=r"gangs\[1\].nodes\[0\]: a-0 has 0 GPUs free"):
        scenario.parse(doc)
    doc["gangs"][1]["nodes"] = ["a-1"]
    plan = planning.plan(scenario.parse(doc), run_id="r")
    assert [r.node for r in plan.gang("x").ranks] == ["a-0", "a-0"]


def test_fractions_are_exact_counts() -> None:
    doc = with_("gangs.0", {"name": "g", "count": 4, "ranks": 4, "gpus_per_rank": 1,
                            "checkpoint": {"opt_in": 0.5, "fail": 0.25, "hang": 0.125,
                                           "durable": 0.5}})  # fmt: skip
    plan = planning.plan(scenario.parse(doc), run_id="r")
    opted = [g for g in plan.gangs if g.opt_in]
    assert len(opted) == 2
    ranks = [r for g in opted for r in g.ranks]  # 8 opted-in ranks
    assert sum(r.fail for r in ranks) == 2
    assert sum(r.hang for r in ranks) == 1
    assert not any(r.fail and r.hang for r in ranks)
    saving = [r for r in ranks if not (r.fail or r.hang)]
    assert sum(not r.durable for r in saving) == round(0.5 * len(saving))
    others = [r for g in plan.gangs if not g.opt_in for r in g.ranks]
    assert not any(r.fail or r.hang for r in others)


def test_distributions() -> None:
    import random

    rng = random.Random(1)
    assert scenario.Dist.model_validate(2.5).sample(rng) == 2.5
    uniform = scenario.Dist.model_validate({"uniform": [1, 2]})
    assert all(1 <= uniform.sample(rng) <= 2 for _ in range(100))
    capped = scenario.Dist.model_validate({"lognormal": {"median": 1, "sigma": 2}, "max": 3})
    draws = [capped.sample(rng) for _ in range(500)]
    assert max(draws) == 3 and min(draws) > 0
    assert capped.upper == 3 and uniform.upper == 2


def test_notice_groups_expand_with_times_duplicates_and_garbage() -> None:
    doc = with_(
        "notices.0",
        {"source": "ec2-sqs", "target": {"pool": "a", "count": 3}, "at_s": 2, "spread_s": 4,
         "issued_offset_s": -10, "duplicates": 2, "malformed": 3, "out_of_order": True},
    )  # fmt: skip
    plan = planning.plan(scenario.parse(doc), run_id="r")
    assert [n.send_at_s for n in plan.notices] == [2.0, 4.0, 6.0]
    issued = [n.issued_at_s for n in plan.notices]
    assert issued == [-4.0, -6.0, -8.0]  # latest-issued goes first, all 10 s late
    assert all(n.copies == 3 for n in plan.notices)
    assert [g.send_at_s for g in plan.garbage] == [2.0, 4.0, 6.0]
    assert [n.index for n in plan.notices] == [0, 1, 2]
    assert plan.sources() == {Source.EC2_SQS}


def test_kueue_and_kafka_targets_name_kueue_gangs() -> None:
    doc = with_("gangs.0.count", 1)
    doc["gangs"].append({"name": "wl", "ranks": 2, "integration": "kueue"})
    doc["notices"] = [
        {"source": "kueue", "target": {"fraction": 1.0}, "pods_stop_after_s": 7},
        {"source": "kafka", "kind": "reclaim", "target": {"gangs": ["wl"]}, "window_s": 30},
    ]
    plan = planning.plan(scenario.parse(doc), run_id="r")
    assert [(n.source, n.gang, n.node) for n in plan.notices] == [
        (Source.KUEUE, "wl", None),
        (Source.KAFKA, "wl", None),
    ]
    assert plan.notices[0].pods_stop_after_s == 7
    assert plan.notices[0].reason == "InCohortReclamation"


def test_targets_by_fraction_round_up_and_stay_in_fleet_order() -> None:
    plan = planning.plan(scenario.parse(base()), run_id="r")
    nodes = [n.node for n in plan.notices]
    assert len(nodes) == 2 and all(n is not None and n.startswith("a-") for n in nodes)
    assert nodes == sorted(nodes, key=lambda k: int(str(k).split("-")[1]))
    doc = with_("notices.0.target", {"zone": "us-east-2a", "fraction": 0.3})
    assert len(planning.plan(scenario.parse(doc), run_id="r").notices) == 2  # ceil(1.2)


def test_windows_follow_the_overrides() -> None:
    plan = planning.plan(scenario.parse(with_("reclaimd.windows", {"ec2_spot_s": 30})), run_id="r")
    assert plan.windows.ec2_spot_s == 30
    assert plan.scenario.reclaimd.as_settings() == {"windows": {"ec2_spot_s": 30.0}}


# --- the verdict ------------------------------------------------------------------------------

T0 = datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC)


def t(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def save(
    received: float, finished: float | None, *, deadline: float = 60, durable: bool = True
) -> Save:
    return Save(
        received_at=t(received),
        deadline=t(deadline),
        finished_at=None if finished is None else t(finished),
        saved=finished is not None,
        durable=durable,
        checkpoint_time=t(received) if finished is not None else None,
    )


def rank(
    i: int,
    *,
    saves: dict[str, Save] | None = None,
    opted: bool = True,
    ckpt: float = -600,
    started: float = -3600,
    gpus: int = 8,
) -> RankFacts:
    return RankFacts(
        pod=f"g-{i}",
        rank=i,
        gpus=gpus,
        annotated_checkpoint=t(ckpt),
        started_at=t(started),
        opted_in=opted,
        leader=i == 0,
        saves=saves or {},
    )


def test_gpu_seconds_follow_the_rule() -> None:
    stop = t(10)
    gang = GangFacts(
        name="g",
        namespace="ns",
        scope="rank",
        ranks=(
            rank(0, saves={"n1": save(1, 2)}),  # acked in time: clock from 1
            rank(1, saves={"n1": save(1, 2, durable=False)}),  # not durable: from -600
            rank(2, saves={"n1": save(1, None)}),  # hung: from -600
            rank(3, started=-100),  # pod started after its checkpoint: from -100
        ),
    )
    low, high = expected_gpu_seconds(gang, stop)
    assert low == high == 8 * (9 + 610 + 610 + 110)


def test_an_ack_that_raced_the_budget_gives_a_range() -> None:
    gang = GangFacts(
        name="g", namespace="ns", scope="rank",
        ranks=(rank(0, saves={"n1": save(1, 59.5, deadline=60)}),),
    )  # fmt: skip
    assert expected_gpu_seconds(gang, t(70)) == (8 * 69, 8 * 670)
    late = GangFacts(
        name="g", namespace="ns", scope="rank",
        ranks=(rank(0, saves={"n1": save(1, 65, deadline=60)}),),
    )  # fmt: skip
    assert expected_gpu_seconds(late, t(70)) == (8 * 670, 8 * 670)


def test_leader_scope_and_earlier_checkpoints() -> None:
    leader_saved = {"n1": save(1, 2)}
    gang = GangFacts(
        name="g", namespace="ns", scope="leader",
        ranks=(rank(0, saves=leader_saved), rank(1), rank(2)),
    )  # fmt: skip
    assert expected_gpu_seconds(gang, t(10)) == (3 * 8 * 9.0, 3 * 8 * 9.0)
    # a durable checkpoint acked for an earlier notice (a rebalance) counts as well
    earlier = GangFacts(
        name="g", namespace="ns", scope="rank",
        ranks=(rank(0, saves={"rebalance": save(-50, -49, deadline=0), "n1": save(1, None)}),),
    )  # fmt: skip
    assert expected_gpu_seconds(earlier, t(10)) == (8 * 60.0, 8 * 60.0)


def facts(
    notice_id: str, gangs: tuple[str, ...], *, response: str = "full", label: str = ""
) -> NoticeFacts:
    return NoticeFacts(
        label=label or notice_id,
        source="ec2-sqs",
        kind="spot-interruption",
        target="a-0",
        notice_id=notice_id,
        response=response,
        deadline=t(120),
        sent_at=t(0),
        gangs=gangs,
        claim_key=f"node-{notice_id}",
    )


TRACE = "0af7651916cd43dd8448eb211c80319c"


def spans_for(notice_id: str, *, drained: float = 5, trace: str = TRACE) -> list[dict[str, Any]]:
    def ns(s: float) -> int:
        return int(t(s).timestamp() * 1e9)

    def span(name: str, start: float, end: float, **attrs: Any) -> dict[str, Any]:
        return {"trace_id": trace, "name": name, "start_ns": ns(start), "end_ns": ns(end),
                "attributes": attrs}  # fmt: skip

    return [
        span("reclaimd.notice", 0, drained + 1, **{"reclaimd.notice.id": notice_id,
                                                   "reclaimd.deadline": t(120).isoformat()}),
        span("reclaimd.claim", 0, 0.1),
        span("reclaimd.cordon", 0.1, 0.2),
        span("reclaimd.checkpoint", 0.2, 2),
        span("reclaimd.checkpoint.rank", 0.3, 1),
        span("reclaimd.checkpoint.rank", 0.4, 1.5),
        span("reclaimd.drain", 2, drained),
    ]  # fmt: skip


def event(gang: str, notice_id: str, gpu_s: float, **over: Any) -> dict[str, Any]:
    return {
        "EventId": f"rw-{gang}-{notice_id}",
        "x_GangId": f"jobset:ns/{gang}",
        "x_K8sNamespaceName": "ns",
        "x_NoticeId": notice_id,
        "x_WastedGpuSeconds": gpu_s,
        "x_DeadlineMet": True,
        "x_CheckpointOutcome": "checkpointed",
        "ChargePeriodEnd": t(10).isoformat().replace("+00:00", "Z"),
        "x_TraceParent": f"00-{TRACE}-00f067aa0ba902b7-01",
        **over,
    }


def one_gang() -> GangFacts:
    return GangFacts(
        name="g", namespace="ns", scope="rank",
        ranks=(rank(0, saves={"n1": save(1, 2)}), rank(1, saves={"n1": save(1, 2)})),
    )  # fmt: skip


def verdict(events: list[dict[str, Any]], **over: Any) -> Verdict:
    args: dict[str, Any] = {
        "scenario": "s",
        "run_id": "r",
        "expect": Expectations(max_notice_to_drained_s=30),
        "notices": [facts("n1", ("g",))],
        "gangs": [one_gang()],
        "observed": Observed(
            events=events, spans=spans_for("n1"), claims={"node-n1": "done"}, queue_depth=0
        ),
    }
    return evaluate(**{**args, **over})


def failing(v: Verdict) -> set[str]:
    return {c.name for c in v.checks if not c.ok and c.required}


def test_a_clean_run_passes_and_reports_its_times() -> None:
    v = verdict([event("g", "n1", 2 * 8 * 9.0)])
    assert v.ok, render(v)
    row = v.notices[0]
    assert row.after_send(row.claimed_at) == pytest.approx(0.1)
    assert row.after_send(row.all_signaled_at) == pytest.approx(0.4)  # the last rank asked
    assert row.to_drained_s == pytest.approx(5)
    assert row.deadline_met is True
    out = to_json(v)
    assert out["ok"] is True and out["notices"][0]["deadline_met"] is True
    assert out["gangs"][0]["expected_gpu_seconds"] == [144.0, 144.0]
    assert out["slowest_notice"] == "n1"
    assert "== verdict: PASS" in render(v)


def test_a_second_event_for_a_gang_fails_the_ledger_check() -> None:
    v = verdict([event("g", "n1", 144.0), event("g", "n2", 144.0)],
                notices=[facts("n1", ("g",)), facts("n2", ("g",))])  # fmt: skip
    assert not v.ok
    assert "ledger: one event per affected gang" in failing(v)
    detail = next(c.detail for c in v.checks if c.name.startswith("ledger"))
    assert "g charged more than once" in detail


def test_missing_and_foreign_events_fail() -> None:
    assert "ledger: one event per affected gang" in failing(verdict([]))
    stray = event("other", "n1", 1.0)
    v = verdict([event("g", "n1", 144.0), stray])
    assert "ledger: one event per affected gang" in failing(v)


def test_wrong_gpu_seconds_fail() -> None:
    v = verdict([event("g", "n1", 150.0)])
    assert failing(v) == {"GPU-seconds equal the ground truth"}


def test_a_missed_deadline_fails() -> None:
    v = verdict([event("g", "n1", 144.0, x_DeadlineMet=False)])
    assert "every deadline met" in failing(v)
    late = verdict(
        [event("g", "n1", 144.0)],
        observed=Observed(
            events=[event("g", "n1", 144.0)],
            spans=spans_for("n1", drained=125),
            claims={"node-n1": "done"},
        ),
    )
    assert {"every deadline met", "notice to drained within 30s"} <= failing(late)


def test_unasked_ranks_and_leftover_pods_fail() -> None:
    lazy = GangFacts(
        name="g", namespace="ns", scope="rank",
        ranks=(rank(0, saves={"n1": save(1, 2)}), rank(1)), pods_left=("g-1",),
    )  # fmt: skip
    v = verdict([event("g", "n1", 8 * 9.0 + 8 * 610.0)], gangs=[lazy])
    assert failing(v) == {"every rank of every affected gang signaled", "evictions done"}


def test_checkpoint_only_notices_charge_nothing_but_must_ask() -> None:
    def run(asked_for: str) -> Verdict:
        gang = GangFacts(
            name="g", namespace="ns", scope="rank",
            ranks=(rank(0, saves={asked_for: save(1, 2)}), rank(1, saves={asked_for: save(1, 2)})),
        )  # fmt: skip
        return verdict(
            [],
            notices=[facts("rb", ("g",), response="checkpoint_only")],
            gangs=[gang],
            observed=Observed(events=[], spans=spans_for("rb"), claims={"node-rb": "done"}),
        )

    v = run("rb")
    assert v.ok, render(v)
    assert "2/2 ranks asked" in next(c.detail for c in v.checks if c.name.startswith("every rank"))
    assert failing(run("another")) == {"every rank of every affected gang signaled"}


def test_traces_must_exist_and_link_the_events() -> None:
    v = verdict(
        [event("g", "n1", 144.0)],
        observed=Observed(
            events=[event("g", "n1", 144.0)], spans=[], claims={"node-n1": "done"}
        ),
    )
    assert "traces present" in failing(v)
    other = verdict([event("g", "n1", 144.0, x_TraceParent=f"00-{'1' * 32}-00f067aa0ba902b7-01")])
    assert failing(other) == {"traces present"}


def test_leftover_messages_and_open_claims_fail() -> None:
    v = verdict(
        [event("g", "n1", 144.0)],
        observed=Observed(
            events=[event("g", "n1", 144.0)], spans=spans_for("n1"),
            claims={"node-n1": "signaled"}, queue_depth=2, garbage_sent=3,
        ),
    )  # fmt: skip
    assert failing(v) == {"transport drained", "every claim done"}


def test_an_ack_counts_when_the_trainer_answered_it_not_when_it_finished() -> None:
    finished_early = save(1, 5, deadline=60)

    def answered(at: float | None) -> Save:
        when = None if at is None else t(at)
        return replace(finished_early, answered_at=when, answers_known=True)

    assert finished_early.counted() is True  # no record of answers: judged by the finish
    assert answered(6).counted() is True
    assert answered(59.5).counted() is None  # answered too close to the end to call
    assert answered(62).counted() is False  # reclaimd could only learn it after its end
    assert answered(None).counted() is False  # never answered while reclaimd asked


def test_opted_out_checks_are_shown_not_counted() -> None:
    v = verdict(
        [event("g", "n1", 144.0, x_DeadlineMet=False)],
        expect=Expectations(deadlines_met=False),
    )
    assert v.ok
    assert any(c.name == "every deadline met" and not c.ok and not c.required for c in v.checks)
    assert "[info] every deadline met" in render(v)


def test_render_cuts_long_tables() -> None:
    notices = [facts(f"n{i}", ()) for i in range(40)]
    v = verdict([], notices=notices, gangs=[one_gang()])
    text = render(v)
    assert "... 15 more notices in the JSON report" in text
    assert len(to_json(v)["notices"]) == 40


def test_yaml_round_trip_of_the_base_document() -> None:
    # the docs show scenarios as YAML; the same document as YAML text must parse the same
    text = yaml.safe_dump(base())
    assert scenario.parse(yaml.safe_load(text)) == scenario.parse(base())


# --- faults: term, partition, several at once on both replicas -----------------------------------


def _faulted(*faults: dict[str, Any], replicas: int = 2) -> scenario.Scenario:
    return scenario.parse({**base(), "reclaimd": {"replicas": replicas}, "faults": list(faults)})


def test_term_and_partition_load() -> None:
    s = _faulted(
        {"kind": "term", "replica": 0, "at_s": 3, "restart_after_s": 2},
        {"kind": "partition", "replica": 1, "at_s": 4, "for_s": 25},
        {"kind": "term", "replica": 1, "at_s": 40, "grace_s": 10},
    )
    term, cut, stop = s.faults
    assert (term.restart_s, term.the_grace_s, term.for_good) == (2, scenario.TERM_GRACE_S, False)
    assert (cut.span_s, cut.for_good) == (25, False) and cut.label == "partition reclaimd-1@4s"
    assert stop.for_good and stop.the_grace_s == 10


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ({"kind": "partition", "replica": 0, "at_s": 1}, "partition needs for_s"),
        ({"kind": "partition", "at_s": 1, "for_s": 5}, "partition needs replica"),
        ({"kind": "term", "replica": 0, "at_s": 1, "for_s": 5}, "term takes no for_s"),
        (
            {"kind": "partition", "replica": 0, "at_s": 1, "for_s": 5, "restart_after_s": 1},
            "partition takes no restart_after_s",
        ),
        ({"kind": "kill", "replica": 0, "at_s": 1, "grace_s": 5}, "kill takes no grace_s"),
        ({"kind": "term", "replica": 0, "at_s": 1, "grace_s": 0}, "greater than 0"),
    ],
)
def test_bad_term_and_partition_faults_are_one_line(fault: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError) as e:
        _faulted(fault)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_several_faults_at_once_on_both_replicas_validate() -> None:
    s = _faulted(
        {"kind": "pause", "replica": 0, "at_s": 2, "for_s": 25},
        {"kind": "partition", "replica": 1, "at_s": 3, "for_s": 10},
        {"kind": "kill", "replica": 1, "at_s": 20, "restart_after_s": 3},
        {"kind": "stop_kafka", "at_s": 4, "for_s": 5},
        {"kind": "term", "replica": 0, "at_s": 40, "restart_after_s": 0},
    )
    assert len(s.faults) == 5
    assert planning.plan(s, run_id="unit").notices


@pytest.mark.parametrize(
    ("faults", "message"),
    [
        # every replica gone for good: nobody finishes
        (
            [{"kind": "kill", "replica": 0, "at_s": 1}, {"kind": "term", "replica": 1, "at_s": 5}],
            "every replica (2) is killed or stopped for good",
        ),
        (
            [{"kind": "term", "replica": 0, "at_s": 1}, {"kind": "kill", "replica": 1, "at_s": 9}],
            "every replica (2) is killed or stopped for good",
        ),
        # nothing can happen to a replica after it is gone for good
        (
            [
                {"kind": "kill", "replica": 0, "at_s": 1},
                {"kind": "pause", "replica": 0, "at_s": 30, "for_s": 5},
            ],
            "overlaps another fault on reclaimd-0 (gone for good before it)",
        ),
        (
            [
                {"kind": "partition", "replica": 1, "at_s": 10, "for_s": 5},
                {"kind": "term", "replica": 1, "at_s": 2},
            ],
            "overlaps another fault on reclaimd-1",
        ),
        (
            [
                {"kind": "partition", "replica": 0, "at_s": 1, "for_s": 10},
                {"kind": "term", "replica": 0, "at_s": 5, "restart_after_s": 1},
            ],
            "overlaps another fault on reclaimd-0",
        ),
    ],
)
def test_fault_combinations_that_cannot_run_are_refused(
    faults: list[dict[str, Any]], message: str
) -> None:
    with pytest.raises(ScenarioError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _faulted(*faults)


def test_the_only_replica_stopped_for_good_is_refused_but_a_rolling_upgrade_is_not() -> None:
    with pytest.raises(ScenarioError, match="the only replica stopped for good"):
        _faulted({"kind": "term", "replica": 0, "at_s": 1}, replicas=1)
    upgrade = _faulted({"kind": "term", "replica": 0, "at_s": 1, "restart_after_s": 0}, replicas=1)
    assert not upgrade.faults[0].for_good
    # one replica for good, the other back: someone is left
    _faulted(
        {"kind": "kill", "replica": 0, "at_s": 1},
        {"kind": "kill", "replica": 1, "at_s": 2, "restart_after_s": 2},
    )


def test_listen_adds_central_sources_with_nothing_sent_on_them() -> None:
    """The storm bench's every-source run: replicas consume sources the scenario sends
    nothing on; a per-node agent is no source a replica consumes."""
    raw = yaml.safe_load((SCENARIOS / "spot-az-storm.yaml").read_text())
    raw.setdefault("reclaimd", {})["listen"] = ["kafka", "gke-pubsub"]
    p = planning.plan(scenario.parse(raw), run_id="t")
    assert p.sources() == {Source.EC2_SQS, Source.KAFKA, Source.GKE_PUBSUB}
    raw["reclaimd"]["listen"] = ["imds"]
    with pytest.raises(ScenarioError, match="listen: imds is not a central source"):
        scenario.parse(raw)
