"""The drills' ``faults:`` (chaos.drill.scenario) and what a fault cost (chaos.drill.verdict)."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from chaos.drill import scenario
from chaos.drill.verdict.evaluate import evaluate
from chaos.drill.verdict.facts import Arrival, ClaimSeen, Expectations, FaultFacts, Observed
from chaos.drill.verdict.render import render, to_json

SCENARIOS = Path(__file__).resolve().parents[2] / "chaos" / "scenarios"
BASE: dict[str, Any] = yaml.safe_load((SCENARIOS / "storm-two-replicas.yaml").read_text())
T0 = datetime.fromisoformat("2026-12-01T12:00:00+00:00")


def _with(*faults: dict[str, Any], **top: Any) -> scenario.Scenario:
    return scenario.parse({**BASE, **top, "faults": list(faults)})


def test_faults_load() -> None:
    s = _with(
        {"kind": "kill", "replica": 0, "at_s": 3},
        {"kind": "pause", "replica": 1, "at_s": 1, "for_s": 25},
        {"kind": "stop_kafka", "at_s": 2, "for_s": 10},
        {"kind": "restart_apiserver", "at_s": 5},
    )
    assert [f.kind for f in s.faults] == ["kill", "pause", "stop_kafka", "restart_apiserver"]
    assert s.faults[0].restart_s is None  # killed for good
    fresh = _with({"kind": "fresh_disk", "replica": 1, "at_s": 0}).faults[0]
    assert fresh.restart_s == 1.0  # a fresh disk always comes back


@pytest.mark.parametrize(
    ("fault", "error"),
    [
        ({"kind": "kill", "at_s": 1}, "kill needs replica"),
        ({"kind": "pause", "replica": 0, "at_s": 1}, "pause needs for_s"),
        ({"kind": "kill", "replica": 0, "at_s": 1, "for_s": 3}, "kill takes no for_s"),
        ({"kind": "stop_kafka", "at_s": 1, "for_s": 31}, "at most 30s"),
        ({"kind": "restart_moto", "replica": 0, "at_s": 1}, "takes no replica"),
        (
            {"kind": "pause", "replica": 0, "at_s": 1, "for_s": 3, "restart_after_s": 1},
            "takes no restart_after_s",
        ),
        ({"kind": "kill", "replica": 2, "at_s": 1}, "faults[0].replica: 2, but reclaimd.replicas"),
        ({"kind": "restart_pubsub", "at_s": 1}, "needs gke-pubsub notices"),
        ({"kind": "reboot", "at_s": 1}, "faults.0.kind: Input should be"),
        ({"kind": "kill", "replica": 0, "at_s": 1, "colour": 1}, "Extra inputs"),
    ],
)
def test_bad_faults_are_one_line(fault: dict[str, Any], error: str) -> None:
    with pytest.raises(scenario.ScenarioError) as e:
        _with(fault)
    assert error in str(e.value) and "\n" not in str(e.value)


def test_the_only_replica_killed_for_good_is_refused() -> None:
    one = {**BASE["reclaimd"], "replicas": 1}
    with pytest.raises(scenario.ScenarioError, match="leaves nobody to finish"):
        _with({"kind": "kill", "replica": 0, "at_s": 1}, reclaimd=one)
    _with({"kind": "kill", "replica": 0, "at_s": 1, "restart_after_s": 2}, reclaimd=one)


def test_two_faults_on_one_replica_must_not_overlap() -> None:
    with pytest.raises(scenario.ScenarioError, match="overlaps"):
        _with(
            {"kind": "pause", "replica": 0, "at_s": 1, "for_s": 10},
            {"kind": "kill", "replica": 0, "at_s": 5},
        )


def _at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def _seen(s: float, holder: str, notice: str, wrote: float, phase: str = "claimed") -> Any:
    return ClaimSeen(_at(s), holder, phase, notice, _at(wrote))


def test_fault_cost_takeovers_and_ledger_delay() -> None:
    fault = FaultFacts(
        label="kill reclaimd-0@3s",
        kind="kill",
        started_at=_at(3),
        ended_at=None,
        holder="r0",
        held={"n1": "A", "n2": "B", "n3": "C"},
    )
    history = {
        # held by r0 at the fault, taken over by r1 at 24 (seen at 24.4), done at 26
        "n1": [_seen(1, "r0", "A", 1), _seen(24.4, "r1", "A", 24), _seen(26.2, "r1", "A", 26)],
        # r0's own version, seen again after the fault: not a new write; nobody else wrote
        "n2": [_seen(1, "r0", "B", 1), _seen(5, "r0", "B", 1)],
        # the poller missed the takeover write; its claim span says 22.5
        "n3": [_seen(1, "r0", "C", 1), _seen(30, "r1", "C", 29, "done")],
    }
    ns = int(_at(22).timestamp() * 1e9)
    spans = [
        {"trace_id": "t", "name": "reclaimd.notice", "start_ns": ns,
         "attributes": {"reclaimd.notice.id": "C"}},
        {"trace_id": "t", "name": "reclaimd.claim", "start_ns": ns,
         "end_ns": ns + 500_000_000, "attributes": {}},
    ]  # fmt: skip
    arrivals = [
        Arrival("g1", "e1", _at(2), _at(2.01), _at(2.02)),  # before: on time
        Arrival("g2", "e2", _at(10), _at(18), _at(18.1)),  # 8 s late
        Arrival("g3", "e3", _at(12), None, _at(12.5)),  # read 0.5 s after: on time
    ]
    v = evaluate(
        scenario="x",
        run_id="r",
        expect=Expectations(),
        notices=[],
        gangs=[],
        observed=Observed(
            events=[], spans=spans, claims={}, claim_history=history, arrivals=arrivals
        ),
        faults=[fault],
    )
    (row,) = v.faults
    by = {t.key: t for t in row.takeovers}
    assert by["n1"].by == "r1" and by["n1"].after_s == pytest.approx(21.0)
    assert by["n2"].by == "" and by["n2"].after_s is None
    assert by["n3"].by == "r1" and by["n3"].after_s == pytest.approx(19.5)
    assert (len(row.taken_over), len(row.resumed), len(row.unrecovered)) == (2, 0, 1)
    assert row.max_takeover_s == pytest.approx(21.0)
    assert row.delayed == 1 and row.max_delay_s == pytest.approx(8.0)
    assert v.summary is not None and v.summary.ledger_delay_max_s == pytest.approx(8.0)
    assert any(c.name == "faults applied" and c.ok for c in v.checks)
    table = render(v)
    assert "kill reclaimd-0@3s" in table and "summary:" in table
    doc = to_json(v)
    assert doc["faults"][0]["taken_over"] == 2 and doc["summary"]["notices"] == 0


def test_a_fault_that_could_not_be_applied_fails_the_verdict() -> None:
    broken = FaultFacts("stop_kafka@2s", "stop_kafka", _at(2), None, error="boom")
    v = evaluate(
        scenario="x",
        run_id="r",
        expect=Expectations(),
        notices=[],
        gangs=[],
        observed=Observed(events=[], spans=[], claims={}),
        faults=[broken],
    )
    assert not v.ok and [c.name for c in v.checks if not c.ok] == ["faults applied"]


def _readiness(*samples: tuple[float, str, int], ended: float | None = 8.0) -> Any:
    fault = FaultFacts(
        label="restart_apiserver@2s",
        kind="restart_apiserver",
        started_at=_at(2),
        ended_at=None if ended is None else _at(ended),
        readiness=tuple((_at(t), name, status) for t, name, status in samples),
    )
    v = evaluate(
        scenario="x",
        run_id="r",
        expect=Expectations(),
        notices=[],
        gangs=[],
        observed=Observed(events=[], spans=[], claims={}),
        faults=[fault],
    )
    return v


def test_readyz_around_a_stack_fault() -> None:
    v = _readiness(
        (2.1, "r0", 200), (2.1, "r1", 200),
        (4.0, "r0", 503), (4.0, "r1", 200),  # r0 sees its watch fail first
        (6.0, "r0", 503), (6.0, "r1", 0),  # r1 does not answer at all: not ready either
        (9.0, "r0", 200), (9.0, "r1", 503),
        (11.5, "r0", 200), (11.5, "r1", 200),  # r1 ready 3.5 s after the outage
    )  # fmt: skip
    (row,) = v.faults
    r = row.readiness
    assert r is not None
    assert (r.replicas, r.unready, r.samples) == (2, 2, 10)
    assert r.first_unready_s == pytest.approx(2.0)
    assert r.ready_again_s == pytest.approx(3.5)
    assert "/readyz: 2/2 replica(s) answered not-ready" in render(v)
    assert to_json(v)["faults"][0]["readyz"]["ready_again_s"] == pytest.approx(3.5)
    assert r.ready_after_fault_s == pytest.approx(9.5)  # r1's 200 at 11.5, fault at 2


def test_readyz_ready_before_the_outage_ends() -> None:
    # stack.sh's own readiness check (the Kueue CRDs) ends the outage after reclaimd is ready
    v = _readiness((3.0, "r0", 503), (5.0, "r0", 200), (7.0, "r0", 200), ended=8.0)
    r = v.faults[0].readiness
    assert r is not None and r.ready_again_s == 0.0
    assert r.ready_after_fault_s == pytest.approx(3.0)
    assert "(3.00s after the fault" in render(v)


def test_readyz_never_unready_and_never_ready_again() -> None:
    steady = _readiness((3.0, "r0", 200), (9.0, "r0", 200)).faults[0].readiness
    assert steady is not None and (steady.unready, steady.first_unready_s) == (0, None)
    assert steady.ready_again_s == 0.0  # ready throughout
    stuck = _readiness((3.0, "r0", 200), (5.0, "r0", 503), (20.0, "r0", 503)).faults[0]
    assert stuck.readiness is not None and stuck.readiness.ready_again_s is None
    assert stuck.readiness.ready_after_fault_s is None
    assert steady.ready_after_fault_s is None  # never not ready: nothing to recover from
    assert _readiness().faults[0].readiness is None  # nothing sampled: no figure


def test_readyz_of_a_replica_killed_meanwhile_is_left_out() -> None:
    v = _readiness(
        (3.0, "r0", 200), (3.0, "r1", 200),
        (5.0, "r0", 0), (5.0, "r1", 200),  # r0 SIGKILLed by another fault, never sampled again
        (9.0, "r1", 200), (12.0, "r1", 200),
    )  # fmt: skip
    r = v.faults[0].readiness
    assert r is not None and (r.replicas, r.unready, r.ready_again_s) == (1, 0, 0.0)
