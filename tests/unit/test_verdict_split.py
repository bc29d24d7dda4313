"""The drill verdict's check that a restart-waste v2 event's per-instance split adds up."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

from chaos import report
from reclaimd.ledger.event import to_event
from reclaimd.ledger.labels import LabelPolicy
from reclaimd.model import (
    CheckpointScope,
    Gang,
    GangKey,
    Member,
    Notice,
    NoticeKind,
    RankAck,
    Target,
    frozen_map,
)
from reclaimd.waste import build_restart_waste

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
CHECK = "waste split by instance sums to the gang"


def mixed_event() -> dict[str, Any]:
    """A real v2 event: three ranks on a spot node and an on-demand node, one rank acked."""
    notice = Notice(
        id="aws-1",
        source="aws.sqs",
        kind=NoticeKind.SPOT_INTERRUPTION,
        target=Target(instance_id="i-0spot", node_name="spot-0"),
        issued_at=T0,
        deadline=T0 + timedelta(seconds=120),
        received_at=T0,
    )
    members = tuple(
        Member(
            namespace="ns",
            name=f"llm-{i}",
            uid=f"u{i}",
            node=("spot-0", "od-0", "od-0")[i],
            gpus=(8, 4, 4)[i],
            last_checkpoint=T0 - timedelta(seconds=600.123 + i),
        )
        for i in range(3)
    )
    gang = Gang(GangKey("jobset", "ns", "llm"), members, CheckpointScope.RANK, frozen_map({}))
    ack = RankAck(member=members[1], acked=True, durable=True, checkpoint_time=T0)
    waste = build_restart_waste(
        notice,
        gang,
        [ack],
        T0 + timedelta(seconds=30.0007),
        deadline_met=True,
        placements={
            "spot-0": {"instance_id": "i-0spot", "purchase_option": "spot"},
            "od-0": {"instance_id": "i-0od", "purchase_option": "on_demand"},
        },
    )
    return to_event(waste, LabelPolicy())


def test_the_ledgers_own_split_adds_up() -> None:
    ev = mixed_event()
    assert len(ev["x_WasteByInstance"]) == 2  # the case the check is for: a gang on two kinds
    assert report.split_problems(ev) == []


def test_parts_that_do_not_add_up_are_named() -> None:
    ev = mixed_event()
    ev["x_WasteByInstance"][0]["x_WastedGpuSeconds"] += 0.01  # beyond rounding
    (problem,) = report.split_problems(ev)
    assert problem.startswith("parts ") and "GPU-s vs" in problem
    fewer = mixed_event()
    fewer["x_WasteByInstance"][1]["x_Ranks"] -= 1
    fewer["x_WasteByInstance"][1]["x_GpuCount"] -= 4
    assert report.split_problems(fewer) == [
        "parts' x_Ranks do not sum to x_GangSize",
        "parts' x_GpuCount do not sum to x_GpuCount",
    ]


def test_rounding_of_each_part_is_not_a_mismatch() -> None:
    ev = mixed_event()
    spot, od = ev["x_WasteByInstance"]
    # true parts 1.0004 and 2.0004 GPU-s: each rounds down, their total (3.0008) rounds up
    spot["x_WastedGpuSeconds"], od["x_WastedGpuSeconds"] = 1.0, 2.0
    ev["x_WastedGpuSeconds"] = 3.001
    assert report.split_problems(ev) == []
    ev["x_WastedGpuSeconds"] = 3.002  # more than three half-units of rounding: a real gap
    assert report.split_problems(ev) == ["parts 3.000 GPU-s vs 3.002"]


def test_a_v2_event_must_carry_the_split_and_a_v1_event_need_not() -> None:
    ev = mixed_event()
    del ev["x_WasteByInstance"]
    assert report.split_problems(ev) == ["v2 event without x_WasteByInstance"]
    v1 = {**ev, "schema": "reclaimd.restart-waste/v1"}
    assert report.split_problems(v1) == []
    assert report.split_problems({**mixed_event(), "x_WasteByInstance": {"a": 1}}) == [
        "x_WasteByInstance is not a list of parts"
    ]


def verdict(events: list[dict[str, Any]], *, exact: bool = True) -> report.Verdict:
    return report.evaluate(
        scenario="s",
        run_id="r",
        expect=report.Expectations(ledger_exact=exact),
        notices=[],
        gangs=[],
        observed=report.Observed(events=events, spans=[], claims={}),
    )


def check(v: report.Verdict) -> report.Check:
    return next(c for c in v.checks if c.name == CHECK)


def test_the_verdict_fails_on_a_split_that_does_not_add_up() -> None:
    good = check(verdict([mixed_event()]))
    assert good.ok and good.required and "1 event(s) split" in good.detail
    bad_event = copy.deepcopy(mixed_event())
    bad_event["x_WastedGpuSeconds"] += 1.0
    bad = check(verdict([bad_event]))
    assert not bad.ok and bad.required and bad.detail.startswith("llm: parts ")
    # a scenario that opts out of an exact ledger shows it without failing on it
    assert not check(verdict([bad_event], exact=False)).required
