"""Issue 37's drill: a fault that strikes a claim's holder (``on_claim``) and the verdict's check
that a silent holder's gangs were still asked with most of their window left."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from chaos.drill import faults, scenario
from chaos.drill.faultdriver import FaultDriver
from chaos.drill.verdict.evaluate import evaluate
from chaos.drill.verdict.facts import (
    Expectations,
    FaultFacts,
    GangFacts,
    NoticeFacts,
    Observed,
    RankFacts,
    Save,
)
from chaos.drill.verdict.silence import ask_budget_check

SCENARIOS = Path(__file__).resolve().parents[2] / "chaos" / "scenarios"
BASE: dict[str, Any] = yaml.safe_load((SCENARIOS / "storm-two-replicas.yaml").read_text())
T0 = datetime.fromisoformat("2026-12-06T12:00:00+00:00")


def _at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def _with(*faults_: dict[str, Any], **top: Any) -> scenario.Scenario:
    return scenario.parse({**BASE, **top, "faults": list(faults_)})


# --- on_claim --------------------------------------------------------------------------------


def test_the_shipped_drill_strikes_the_claim_holder_and_judges_the_budget() -> None:
    s = scenario.load(SCENARIOS / "gce-silent-holder-30s.yaml")
    (f,) = s.faults
    assert f.on_claim and f.replica is None and f.kind is scenario.FaultKind.PAUSE
    assert f.label == "pause (claim holder)@0s"
    assert s.expect.min_ask_budget == 0.5 and s.reclaimd.replicas == 2
    # the pause outlasts the 30 s window: only a takeover can save the gang
    assert f.for_s is not None and f.for_s > 30


@pytest.mark.parametrize(
    ("fault", "top", "message"),
    [
        ({"kind": "pause", "on_claim": True, "replica": 0, "at_s": 0, "for_s": 5}, {}, "give no"),
        ({"kind": "stop_kafka", "on_claim": True, "at_s": 0, "for_s": 5}, {}, "stack fault"),
        (
            {"kind": "pause", "on_claim": True, "at_s": 0, "for_s": 5},
            {"reclaimd": {**BASE["reclaimd"], "replicas": 1}},
            "replicas >= 2",
        ),
    ],
)
def test_bad_on_claim_faults_are_one_line(
    fault: dict[str, Any], top: dict[str, Any], message: str
) -> None:
    with pytest.raises(scenario.ScenarioError) as e:
        _with(fault, **top)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_an_on_claim_fault_is_alone() -> None:
    with pytest.raises(scenario.ScenarioError, match="no other fault"):
        _with(
            {"kind": "pause", "on_claim": True, "at_s": 0, "for_s": 5},
            {"kind": "kill", "replica": 1, "at_s": 9},
        )


def _driver(claims: list[dict[str, tuple[str, str]]]) -> tuple[FaultDriver, list[str]]:
    """A driver whose replicas are r0, r1 and whose claim reads return ``claims`` in turn."""
    said: list[str] = []
    world = SimpleNamespace(replicas=["r0", "r1"], ports={}, proxies={})
    driver = FaultDriver(Any, Any, world, Any, say=said.append)  # type: ignore[arg-type]
    reads = iter(claims)

    async def open_claims() -> dict[str, tuple[str, str]]:
        return next(reads, claims[-1])

    def hooks(h: Any) -> faults.FaultHooks:
        return faults.FaultHooks(
            replica=lambda i: world.replicas[i],
            holder_of=lambda d: f"holder-{d}",
            replace=None,  # type: ignore[arg-type]
            open_claims=open_claims,
            after_restart=None,  # type: ignore[arg-type]
            say=said.append,
        )

    driver._hooks = hooks  # type: ignore[method-assign]
    return driver, said


def test_on_claim_strikes_the_replica_first_seen_holding_a_claim(monkeypatch: Any) -> None:
    monkeypatch.setattr("chaos.drill.faultdriver.ON_CLAIM_POLL_S", 0.0)
    f = scenario.Fault(kind=scenario.FaultKind.PAUSE, at_s=0, for_s=5, on_claim=True)
    driver, said = _driver([{}, {"g-0": ("other-holder", "A")}, {"g-0": ("holder-r1", "A")}])
    aimed = asyncio.run(driver._claim_holder(None, f))  # type: ignore[arg-type]
    assert aimed.replica == 1 and aimed.on_claim and aimed.label == "pause reclaimd-1@0s"
    assert said == ["fault pause (claim holder)@0s: holder-r1 holds a claim"]


def test_on_claim_with_no_claim_strikes_replica_0_and_says_so(monkeypatch: Any) -> None:
    monkeypatch.setattr("chaos.drill.faultdriver.ON_CLAIM_POLL_S", 0.0)
    monkeypatch.setattr("chaos.drill.faultdriver.ON_CLAIM_WAIT_S", 0.05)
    f = scenario.Fault(kind=scenario.FaultKind.PAUSE, at_s=0, for_s=5, on_claim=True)
    driver, said = _driver([{}])
    assert asyncio.run(driver._claim_holder(None, f)).replica == 0  # type: ignore[arg-type]
    assert "no claim seen" in said[-1]


# --- the budget check ------------------------------------------------------------------------


def _notice(nid: str = "A", gangs: tuple[str, ...] = ("train",)) -> NoticeFacts:
    return NoticeFacts(
        label=f"gke-pubsub#{nid}", source="gke-pubsub", kind="preemption", target="g-0",
        notice_id=nid, response="full", deadline=_at(30), sent_at=_at(0), gangs=gangs,
    )  # fmt: skip


def _gang(*asked_at: float | None, name: str = "train", notice: str = "A") -> GangFacts:
    def rank(i: int, t: float | None) -> RankFacts:
        saves = {} if t is None else {notice: Save(_at(t), _at(27), _at(t + 1), True, True, None)}
        return RankFacts(f"{name}-{i}", i, 4, None, None, True, i == 0, saves)

    return GangFacts(name, "ns", "rank", tuple(rank(i, t) for i, t in enumerate(asked_at)))


def _pause(at: float = 1.0, held: dict[str, str] | None = None) -> FaultFacts:
    return FaultFacts(
        label=f"pause reclaimd-0@{at:g}s", kind="pause", started_at=_at(at),
        ended_at=_at(at + 35), holder="r0", successor="r0", replica=0,
        held={"g-0": "A"} if held is None else held,
    )  # fmt: skip


def test_a_takeover_that_leaves_most_of_the_window_passes() -> None:
    c = ask_budget_check([_pause()], [_notice()], {"train": _gang(8.0, 8.2)}, 0.5)
    assert c.ok and "train: asked 21.8s before its deadline (30s window)" in c.detail


def test_a_takeover_after_the_claim_lease_fails_with_the_figure() -> None:
    # today's lease: taken over at ~21 s of a 30 s window, 9 s left for the ranks
    c = ask_budget_check([_pause()], [_notice()], {"train": _gang(21.0, 21.4)}, 0.5)
    assert not c.ok and "asked 8.6s before its deadline" in c.detail and "under 15.0s" in c.detail


def test_a_gang_asked_before_the_silence_did_not_test_it() -> None:
    c = ask_budget_check([_pause(at=3.0)], [_notice()], {"train": _gang(0.5, 0.6)}, 0.5)
    assert not c.ok and "asked before pause" in c.detail


def test_a_rank_never_asked_fails_and_no_held_claim_fails() -> None:
    c = ask_budget_check([_pause()], [_notice()], {"train": _gang(8.0, None)}, 0.5)
    assert not c.ok and "1 rank(s) never asked" in c.detail
    c = ask_budget_check([_pause(held={})], [_notice()], {"train": _gang(8.0, 8.0)}, 0.5)
    assert not c.ok and "no silenced replica held a claim" in c.detail
    kill = FaultFacts(label="kill", kind="kill", started_at=_at(1), ended_at=None, held={"g": "A"})
    assert not ask_budget_check([kill], [_notice()], {"train": _gang(8.0)}, 0.5).ok


def test_the_verdict_checks_the_budget_only_when_the_scenario_asks() -> None:
    def verdict(expect: Expectations) -> list[str]:
        v = evaluate(
            scenario="x", run_id="r", expect=expect, notices=[_notice()],
            gangs=[_gang(21.0)], observed=Observed(events=[], spans=[], claims={}),
            faults=[_pause()], replicas=2,
        )  # fmt: skip
        return [c.name for c in v.checks if not c.ok]

    assert not any("silent holder" in name for name in verdict(Expectations()))
    assert any("silent holder" in name for name in verdict(Expectations(min_ask_budget=0.5)))
