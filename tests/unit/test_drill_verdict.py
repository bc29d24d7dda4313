"""The drill judge's takeover facts, late versus lost, false takeovers and graceful stops (pure:
chaos.drill.run ``_save_facts``, chaos.drill.verdict, chaos.drill.faults with fake processes)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

import pytest

from chaos.drill import faults, scenario
from chaos.drill.run import _save_facts
from chaos.drill.verdict.checks import asked_of
from chaos.drill.verdict.evaluate import evaluate
from chaos.drill.verdict.facts import (
    Arrival,
    ClaimSeen,
    Expectations,
    FaultFacts,
    GangFacts,
    GaveUp,
    NoticeFacts,
    Observed,
    RankFacts,
    Save,
)
from chaos.drill.verdict.model import Verdict
from chaos.drill.verdict.render import render, to_json
from chaos.drill.verdict.takeover import LIVE_SLACK_S
from chaos.drill.verdict.traces import index_traces
from chaos.trainers import SaveRecord

T0 = datetime.fromisoformat("2026-12-01T12:00:00+00:00")


def _at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def _ns(s: float) -> int:
    return int(_at(s).timestamp() * 1e9)


# --- _save_facts: which deadline judges an ack ----------------------------------------------


@dataclass
class _Request:
    notice_id: str
    deadline: datetime
    received_at: datetime


@dataclass
class _Server:
    answered: dict[str, datetime] = field(default_factory=dict)


@dataclass
class _Trainer:
    requests: list[_Request]
    server: _Server


def _record(**kw: Any) -> SaveRecord:
    base: dict[str, Any] = {
        "notice_id": "n",
        "received_at": _at(1),
        "deadline": _at(10),
        "finished_at": _at(4),
        "saved": True,
        "durable": True,
        "checkpoint_time": _at(1),
    }
    return SaveRecord(**{**base, **kw})


def test_an_ack_is_judged_by_the_latest_request_before_the_answer() -> None:
    # reclaimd-0 asked at 1 (deadline 10); its successor asked again at 12 (deadline 25);
    # the trainer answered at 14; a third request at 20 came after the answer
    trainer = _Trainer(
        requests=[
            _Request("n", _at(10), _at(1)),
            _Request("other", _at(99), _at(2)),  # another notice's: not this one's deadline
            _Request("n", _at(25), _at(12)),
            _Request("n", _at(40), _at(20)),
        ],
        server=_Server({"n": _at(14)}),
    )
    s = _save_facts(trainer, "n", _record(finished_at=_at(13)))  # type: ignore[arg-type]
    assert s.deadline == _at(25) and s.answered_at == _at(14) and s.answers_known
    assert s.counted() is True  # 11 s before the successor's deadline
    # judged by the first request's deadline alone it would have been late
    assert Save(**{**s.__dict__, "deadline": _at(10)}).counted() is False


def test_an_answer_inside_a_pause_that_spans_the_deadline_is_too_close_to_call() -> None:
    """reclaimd-0 was SIGSTOPped from 5 to 30; the rank's deadline (10) and its answer (14)
    both fell in the pause: the answer sat in the kernel until 30, and reclaimd cannot place
    it before or after 10. Outside such a pause the ordinary rule decides."""
    trainer = _Trainer(requests=[_Request("n", _at(10), _at(1))], server=_Server({"n": _at(14)}))
    record = _record(finished_at=_at(13))
    paused = _save_facts(trainer, "n", record, [(_at(5), _at(30))])  # type: ignore[arg-type]
    assert paused.unplaceable and paused.counted() is None
    plain = _save_facts(trainer, "n", record)  # type: ignore[arg-type]
    assert not plain.unplaceable and plain.counted() is False  # 4 s late
    # the pause ended before the deadline: reclaimd was awake at 10, the answer was late
    woke = _save_facts(trainer, "n", record, [(_at(5), _at(9))])  # type: ignore[arg-type]
    assert woke.counted() is False


def test_an_answer_just_before_its_replicas_sigkill_is_too_close_to_call() -> None:
    """Asked at 1, answered at 4, in time for its deadline of 10: reclaimd-0 was SIGKILLed at
    4.5, before it could have written the ack, or at 3, before it heard it; its successor
    cannot know of it. A kill well after the answer leaves the ordinary rule: the ack was to
    be written by then."""
    trainer = _Trainer(requests=[_Request("n", _at(10), _at(1))], server=_Server({"n": _at(4)}))
    record = _record(finished_at=_at(4))
    killed = _save_facts(trainer, "n", record, kills=[_at(4.5)])  # type: ignore[arg-type]
    assert killed.unplaceable and killed.counted() is None
    later = _save_facts(trainer, "n", record, kills=[_at(6)])  # type: ignore[arg-type]
    assert not later.unplaceable and later.counted() is True
    # killed after asking (1) but before the answer (4): nobody got the answer
    unheard = _save_facts(trainer, "n", record, kills=[_at(3)])  # type: ignore[arg-type]
    assert unheard.unplaceable and unheard.counted() is None
    # a kill before the request: the replica that asked was alive
    asked_after = _Trainer(requests=[_Request("n", _at(10), _at(2))], server=_Server({"n": _at(4)}))
    alive = _save_facts(asked_after, "n", record, kills=[_at(1.5)])  # type: ignore[arg-type]
    assert not alive.unplaceable and alive.counted() is True


def test_an_unanswered_save_takes_every_request_and_does_not_count() -> None:
    trainer = _Trainer(
        requests=[_Request("n", _at(10), _at(1)), _Request("n", _at(30), _at(20))],
        server=_Server({}),
    )
    s = _save_facts(trainer, "n", _record())  # type: ignore[arg-type]
    assert s.deadline == _at(30) and s.answered_at is None
    assert s.counted() is False  # finished, never answered: reclaimd could not count it


def test_the_save_records_own_deadline_counts_with_no_request_kept() -> None:
    trainer = _Trainer(requests=[], server=_Server({"n": _at(5)}))
    s = _save_facts(trainer, "n", _record(deadline=_at(5.5)))  # type: ignore[arg-type]
    assert s.deadline == _at(5.5) and s.counted() is None  # 0.5 s: too close to call


# --- takeover time ---------------------------------------------------------------------------


def _seen(s: float, holder: str, notice: str, wrote: float | None, phase: str = "claimed") -> Any:
    return ClaimSeen(_at(s), holder, phase, notice, None if wrote is None else _at(wrote))


def _evaluate(
    *,
    faults_: list[FaultFacts] = (),  # type: ignore[assignment]
    history: dict[str, list[ClaimSeen]] | None = None,
    spans: list[dict[str, Any]] | None = None,
    by_holder: dict[str, list[dict[str, Any]]] | None = None,
    replicas: int = 0,
    **observed: Any,
) -> Verdict:
    return evaluate(
        scenario="x",
        run_id="r",
        expect=Expectations(),
        notices=observed.pop("notices", []),
        gangs=observed.pop("gangs", []),
        observed=Observed(
            events=observed.pop("events", []),
            spans=spans or [],
            claims=observed.pop("claims", {}),
            claim_history=history or {},
            spans_by_holder=by_holder or {},
            **observed,
        ),
        faults=list(faults_),
        replicas=replicas,
    )


def _kill(at: float = 3, holder: str = "r0", **kw: Any) -> FaultFacts:
    return FaultFacts(
        label=kw.pop("label", f"kill reclaimd-0@{at:g}s"),
        kind=kw.pop("kind", "kill"),
        started_at=_at(at),
        ended_at=kw.pop("ended_at", None),
        holder=holder,
        **kw,
    )


def test_takeover_time_is_the_writers_stamp_not_when_the_poller_saw_it() -> None:
    f = _kill(held={"n1": "A"})
    v = _evaluate(faults_=[f], history={"n1": [_seen(1, "r0", "A", 1), _seen(26, "r1", "A", 24.2)]})
    (t,) = v.faults[0].takeovers
    assert t.by == "r1" and t.after_s == pytest.approx(21.2)


def test_takeover_time_falls_back_to_when_seen_without_a_stamp() -> None:
    f = _kill(held={"n1": "A"})
    v = _evaluate(faults_=[f], history={"n1": [_seen(1, "r0", "A", 1), _seen(25, "r1", "A", None)]})
    assert v.faults[0].takeovers[0].after_s == pytest.approx(22.0)


def test_a_claim_span_earlier_than_the_stamp_times_the_takeover() -> None:
    f = _kill(held={"n1": "A"})
    spans = [
        {"trace_id": "t", "name": "reclaimd.notice", "start_ns": _ns(20),
         "attributes": {"reclaimd.notice.id": "A"}},
        {"trace_id": "t", "name": "reclaimd.claim", "start_ns": _ns(20), "end_ns": _ns(20.5),
         "attributes": {}},
        # a claim span of the old holder from before the fault: not the takeover
        {"trace_id": "u", "name": "reclaimd.notice", "start_ns": _ns(0.5),
         "attributes": {"reclaimd.notice.id": "A"}},
        {"trace_id": "u", "name": "reclaimd.claim", "start_ns": _ns(0.5), "end_ns": _ns(0.6),
         "attributes": {}},
    ]  # fmt: skip
    v = _evaluate(
        faults_=[f], history={"n1": [_seen(1, "r0", "A", 1), _seen(30, "r1", "A", 29, "done")]},
        spans=spans,
    )  # fmt: skip
    assert v.faults[0].takeovers[0].after_s == pytest.approx(17.5)


def test_the_faulted_holders_own_later_write_is_a_resume_not_a_takeover() -> None:
    f = _kill(held={"n1": "A"}, ended_at=_at(8), successor="r0")  # kill + restart, same disk
    history = {"n1": [_seen(1, "r0", "A", 1), _seen(3.2, "r0", "A", 1), _seen(9, "r0", "A", 8.5)]}
    v = _evaluate(faults_=[f], history=history)
    row = v.faults[0]
    assert (len(row.taken_over), len(row.resumed)) == (0, 1)
    assert row.resumed[0].after_s == pytest.approx(5.5)
    assert v.summary is not None and v.summary.takeovers == 0


def test_takeover_percentiles_over_every_claim_taken() -> None:
    f = _kill(held={f"n{i}": f"N{i}" for i in range(5)})
    history = {
        f"n{i}": [_seen(1, "r0", f"N{i}", 1), _seen(30, "r1", f"N{i}", 3 + after)]
        for i, after in enumerate([1.0, 2.0, 3.0, 4.0, 21.0])
    }
    v = _evaluate(faults_=[f], history=history)
    u = v.summary
    assert u is not None and u.takeovers == 5
    assert u.takeover_p50_s == pytest.approx(3.0)
    assert u.max_takeover_s == pytest.approx(21.0)
    assert 4.0 < (u.takeover_p99_s or 0) <= 21.0
    assert "takeover p50 3.00s" in render(v)


# --- false takeovers: of a live holder, and what a fenced holder still did -------------------


def test_a_takeover_of_a_holder_with_no_fault_is_a_live_takeover() -> None:
    history = {"n1": [_seen(1, "r0", "A", 1), _seen(6, "r1", "A", 5.5)]}
    v = _evaluate(history=history)  # no fault at all
    (c,) = v.holder_changes
    assert (c.old, c.new, c.of_live_holder) == ("r0", "r1", True)
    assert v.summary is not None and v.summary.live_takeovers == 1
    assert "LIVE HOLDER" in render(v)
    assert to_json(v)["holder_changes"][0]["live_holder"] is True


def test_a_takeover_during_a_pause_is_of_a_presumed_dead_holder() -> None:
    pause = _kill(kind="pause", label="pause reclaimd-0@3s", ended_at=_at(28), successor="r0")
    history = {"n1": [_seen(1, "r0", "A", 1), _seen(24, "r1", "A", 23.5)]}
    v = _evaluate(faults_=[pause], history=history)
    (c,) = v.holder_changes
    assert c.fault == "pause reclaimd-0@3s" and not c.of_live_holder and not c.fenced


def test_what_the_paused_holder_did_after_its_takeover_is_counted() -> None:
    pause = _kill(kind="pause", label="pause reclaimd-0@3s", ended_at=_at(28), successor="r0")
    history = {
        "n1": [
            _seen(1, "r0", "A", 1),
            _seen(24, "r1", "A", 23.5),
            _seen(28.5, "r0", "A", 28.2),  # it woke and wrote the claim again
        ]
    }
    root = {"trace_id": "t", "name": "reclaimd.notice", "start_ns": _ns(0.9), "end_ns": _ns(29),
            "attributes": {"reclaimd.notice.id": "A"}}  # fmt: skip

    def step(name: str, s: float) -> dict[str, Any]:
        return {"trace_id": "t", "name": name, "start_ns": _ns(s), "end_ns": _ns(s + 0.1),
                "attributes": {}}  # fmt: skip

    mine = [
        root,
        step("reclaimd.cordon", 1.0),  # before the takeover: its own work
        step("reclaimd.evict", 3.0),  # in flight at the pause, before the takeover
        step("reclaimd.evict", 28.05),  # after: a fenced holder acting
        step("reclaimd.ledger", 28.1),
        step("reclaimd.drain", 28.0),  # a container, not a step
        step("reclaimd.evict", 28.4),  # after it wrote the claim again: its retake's own work
    ]
    v = _evaluate(faults_=[pause], history=history, by_holder={"r0": mine})
    # the old holder wrote back: the second change (r1 -> r0) is a takeover of live r1
    first, second = v.holder_changes
    assert first.fenced == ("evict", "ledger")
    assert second.old == "r1" and second.of_live_holder and second.fenced == ()
    u = v.summary
    assert u is not None and u.fenced_actions == 2 and u.live_takeovers == 1
    assert "after it the old holder did: evict, ledger" in render(v)


def test_a_restarted_holder_is_live_again_after_a_short_slack() -> None:
    kill = _kill(ended_at=_at(8), successor="r0")  # back on the same disk at 8
    soon = {"n1": [_seen(1, "r0", "A", 1), _seen(11, "r1", "A", 8 + LIVE_SLACK_S - 0.1)]}
    late = {"n1": [_seen(1, "r0", "A", 1), _seen(30, "r1", "A", 20)]}
    assert not _evaluate(faults_=[kill], history=soon).holder_changes[0].of_live_holder
    assert _evaluate(faults_=[kill], history=late).holder_changes[0].of_live_holder


def test_a_replaced_holder_stays_presumed_dead() -> None:
    term = _kill(kind="term", ended_at=_at(6), successor="r0-next")  # a successor, new name
    history = {"n1": [_seen(1, "r0", "A", 1), _seen(90, "r0-next", "A", 89)]}
    (c,) = _evaluate(faults_=[term], history=history).holder_changes
    assert not c.of_live_holder


def _trace(trace: str, notice: str, *steps: tuple[str, float]) -> list[dict[str, Any]]:
    root = {"trace_id": trace, "name": "reclaimd.notice", "start_ns": _ns(0.5),
            "end_ns": _ns(20), "attributes": {"reclaimd.notice.id": notice}}  # fmt: skip
    return [root] + [
        {
            "trace_id": trace,
            "name": name,
            "start_ns": _ns(at),
            "end_ns": _ns(at + 0.1),
            "attributes": {},
        }
        for name, at in steps
    ]


def test_a_takeover_too_quick_for_the_poller_is_found_in_the_span_files() -> None:
    # r1 took A over 0.3 s after r0 claimed it (between two reads of the claims); both worked
    # on it, each in a trace of its own; B was only r0's
    r0 = _trace("t0", "A", ("reclaimd.claim", 1.0), ("reclaimd.evict", 1.5), ("reclaimd.ledger", 4))
    r0 += _trace("t2", "B", ("reclaimd.claim", 1.0))
    r1 = _trace("t1", "A", ("reclaimd.checkpoint.rank", 1.3), ("reclaimd.evict", 2.0))
    notices = [_notice("a", "ga", "node-a")]
    notices = [replace(notices[0], notice_id="A")]
    v = _evaluate(by_holder={"r0": r0, "r1": r1}, notices=notices, gangs=[_gang("ga")])
    (c,) = v.holder_changes
    assert (c.key, c.old, c.new, c.of_live_holder) == ("node-a", "r0", "r1", True)
    assert c.at == _at(1.3) and c.fenced == ("evict", "ledger")
    # seen by the poller too: reported once
    history = {"node-a": [_seen(1, "r0", "A", 1), _seen(1.6, "r1", "A", 1.3)]}
    v = _evaluate(by_holder={"r0": r0, "r1": r1}, history=history)
    assert len(v.holder_changes) == 1


def test_not_takeovers_a_new_notice_a_done_claim_or_the_same_holder() -> None:
    history = {
        "n1": [_seen(1, "r0", "A", 1), _seen(2, "r1", "B", 2)],  # another notice on the node
        "n2": [_seen(1, "r0", "C", 1, "done"), _seen(5, "r1", "C", 5)],  # after done
        "n3": [_seen(1, "r0", "D", 1), _seen(5, "r0", "D", 5, "done")],
        "n4": [_seen(1, "", "E", None), _seen(2, "r1", "E", 2)],  # no holder before
    }
    assert _evaluate(history=history).holder_changes == ()


# --- late versus lost ------------------------------------------------------------------------


def _notice(label: str, gang: str, key: str) -> NoticeFacts:
    return NoticeFacts(
        label=label, source="ec2-sqs", kind="spot-interruption", target=key,
        notice_id=f"id-{label}", response="full", deadline=_at(120), sent_at=_at(0),
        gangs=(gang,), claim_key=key,
    )  # fmt: skip


def _gang(name: str) -> GangFacts:
    rank = RankFacts(
        pod=f"{name}-0", rank=0, gpus=8, annotated_checkpoint=_at(-600), started_at=_at(-3600),
        opted_in=False, leader=True,
    )  # fmt: skip
    return GangFacts(name=name, namespace="ns", scope="rank", ranks=(rank,))


def _event(gang: str, notice: str, stopped: float = 10) -> dict[str, Any]:
    return {
        "x_GangId": f"ns/{gang}", "x_K8sNamespaceName": "ns", "x_NoticeId": notice,
        "EventId": f"e-{gang}", "ChargePeriodEnd": _at(stopped).isoformat(),
        "x_WastedGpuSeconds": 8 * (stopped + 600), "x_DeadlineMet": True,
    }  # fmt: skip


def test_late_pending_and_lost_are_told_apart_when_the_drill_gives_up() -> None:
    notices = [_notice("a", "ga", "node-a"), _notice("b", "gb", "node-b"),
               _notice("c", "gc", "node-c"), _notice("d", "gd", "node-d")]  # fmt: skip
    gave_up = GaveUp(
        at=_at(100), timeout_s=90, events=1, events_wanted=4,
        open_claims={"node-b": "checkpointing", "node-c": "claimed"},
        claim_holders={"node-b": "r1", "node-c": "r1"}, live_holders=frozenset({"r1"}),
    )  # fmt: skip
    events = [_event("ga", "id-a"), _event("gb", "id-b")]
    arrivals = [
        Arrival("ga", "e-ga", _at(10), _at(10.1), _at(10.2)),  # in time
        Arrival("gb", "e-gb", _at(103), _at(103.1), _at(103.2)),  # flushed at the stop
    ]
    v = _evaluate(
        notices=notices,
        gangs=[_gang(g) for g in ("ga", "gb", "gc", "gd")],
        events=events,
        claims={"node-a": "done", "node-b": "done", "node-c": "claimed", "node-d": "done"},
        arrivals=arrivals,
        gave_up=gave_up,
    )
    # gb: charged after the give-up (late); gc: its claim still open then (pending, late);
    # gd: claim done, no event at all: lost
    assert v.late_gangs == ("gb",) and v.pending_gangs == ("gc",)
    u = v.summary
    assert u is not None and (u.lost, u.late, u.gave_up) == (1, 2, True)
    waited = next(c for c in v.checks if c.name == "drill waited to the end")
    assert not waited.ok and waited.required
    assert "gave up after 90s: 1/4 event(s)" in waited.detail
    assert "charged after it (late, not lost): gb" in waited.detail
    assert "still pending then (late, not lost): gc" in waited.detail
    ledger = next(c for c in v.checks if c.name.startswith("ledger"))
    assert "missing for gc, gd" in ledger.detail and "pending when it gave up, not lost: gc" in (
        ledger.detail
    )
    assert "GAVE UP" in render(v)
    doc = to_json(v)
    assert doc["gave_up"]["timeout_s"] == 90 and doc["late_gangs"] == ["gb"]
    assert doc["summary"]["lost"] == 1 and doc["summary"]["late"] == 2


def test_a_claim_abandoned_by_a_holder_that_is_gone_is_lost_not_pending() -> None:
    notices = [_notice("a", "ga", "node-a"), _notice("b", "gb", "node-b"),
               _notice("c", "gc", "node-c")]  # fmt: skip
    gave_up = GaveUp(
        at=_at(100), timeout_s=90, events=0, events_wanted=3,
        open_claims={"node-a": "claimed", "node-b": "claimed", "node-c": ""},
        claim_holders={"node-a": "r0", "node-b": "r1", "node-c": ""},
        live_holders=frozenset({"r1"}),  # r0 SIGTERMed and exited, nobody took node-a over
    )  # fmt: skip
    v = _evaluate(notices=notices, gangs=[_gang(g) for g in ("ga", "gb", "gc")],
                  claims={"node-a": "claimed", "node-b": "claimed"}, gave_up=gave_up)  # fmt: skip
    assert v.pending_gangs == ("gb",)  # r1 still at it
    u = v.summary
    assert u is not None and (u.lost, u.late) == (2, 1)  # ga abandoned, gc never claimed
    waited = next(c for c in v.checks if c.name == "drill waited to the end")
    assert "node-a claimed by r0, gone" in waited.detail and "node-c no claim" in waited.detail


def test_without_a_give_up_a_missing_event_is_lost() -> None:
    v = _evaluate(
        notices=[_notice("a", "ga", "node-a")],
        gangs=[_gang("ga")],
        claims={"node-a": "done"},
    )
    u = v.summary
    assert u is not None and (u.lost, u.late, u.gave_up) == (1, 0, False)
    waited = next(c for c in v.checks if c.name == "drill waited to the end")
    assert waited.ok


def test_over_and_under_charged_gangs_are_counted_apart() -> None:
    notices = [_notice("a", "ga", "node-a"), _notice("b", "gb", "node-b")]
    over, under = _event("ga", "id-a"), _event("gb", "id-b")
    over["x_WastedGpuSeconds"] += 100
    under["x_WastedGpuSeconds"] -= 100
    v = _evaluate(notices=notices, gangs=[_gang("ga"), _gang("gb")], events=[over, under],
                  claims={"node-a": "done", "node-b": "done"})  # fmt: skip
    u = v.summary
    assert u is not None and (u.over_charged, u.under_charged, u.lost) == (1, 1, 0)


# --- graceful stops ----------------------------------------------------------------------------


def _term(**kw: Any) -> FaultFacts:
    return FaultFacts(
        label="term reclaimd-0@3s", kind="term", started_at=_at(3), ended_at=_at(5),
        holder="r0", successor="r0-next", grace_s=60, **kw,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("kw", "ok", "says"),
    [
        ({"exited_at": _at(7.5), "exit_code": 0}, True, "term reclaimd-0@3s 4.5s (grace 60s)"),
        ({"exited_at": _at(63), "exit_code": -9, "sigkilled": True}, False, "SIGKILLed"),
        ({"exited_at": _at(6), "exit_code": 1}, False, "exited 1 after 3.0s"),
        ({}, False, "no exit seen"),
    ],
)
def test_a_sigtermed_replica_must_exit_by_itself_within_its_grace(
    kw: dict[str, Any], ok: bool, says: str
) -> None:
    v = _evaluate(faults_=[_term(**kw)])
    check = next(c for c in v.checks if c.name == "SIGTERMed replicas exited within their grace")
    assert check.ok is ok and check.required and says in check.detail
    if kw.get("exit_code") is not None:
        assert "exit: exited" in render(v)


# --- chaos.drill.faults: term and partition with fake processes ---------------------------------


class _Proc:
    def __init__(self, name: str, exits_after: float | None, code: int = 0) -> None:
        self.name = name
        self.exits_after, self.code = exits_after, code
        self.signals: list[str] = []
        self._gone = asyncio.Event()
        self.returncode: int | None = None

    def terminate(self) -> None:
        self.signals.append("TERM")
        if self.exits_after is not None:
            asyncio.get_running_loop().call_later(self.exits_after, self._exit, self.code)

    def _exit(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
            self._gone.set()

    async def wait(self) -> int | None:
        await self._gone.wait()
        return self.returncode

    async def crash(self) -> None:
        self.signals.append("KILL")
        self._exit(-9)


def _hooks(procs: list[_Proc], started: list[str], cuts: list[tuple[int, bool]]) -> Any:
    async def replace(i: int) -> Any:
        new = _Proc(f"reclaimd-{i}-next", None)
        started.append(new.name)
        procs[i] = new
        return new

    async def open_claims() -> dict[str, tuple[str, str]]:
        return {"node-a": ("reclaimd-0", "A"), "node-b": ("reclaimd-1", "B")}

    async def partition(i: int, cut: bool) -> int:
        cuts.append((i, cut))
        return 3 if cut else 0

    async def after_restart(kind: Any) -> int:
        return 0

    return faults.FaultHooks(
        replica=lambda i: procs[i],  # type: ignore[arg-type,return-value]
        holder_of=lambda d: d.name,
        replace=replace,
        open_claims=open_claims,
        after_restart=after_restart,
        say=lambda _: None,
        partition=partition,
    )


def _fault(**kw: Any) -> scenario.Fault:
    return scenario.Fault.model_validate(kw)


async def test_term_with_a_successor_records_the_exit_and_the_new_holder() -> None:
    procs, started, cuts = [_Proc("reclaimd-0", exits_after=0.2)], [], []  # type: ignore[var-annotated]
    old = procs[0]
    f = _fault(kind="term", replica=0, at_s=0, restart_after_s=0.05, grace_s=5)
    rec = await faults.apply(f, None, _hooks(procs, started, cuts))  # type: ignore[arg-type]
    assert old.signals == ["TERM"] and started == ["reclaimd-0-next"]
    assert rec.held == {"node-a": "A"} and rec.holder == "reclaimd-0"
    assert rec.successor == "reclaimd-0-next" and rec.ended_at is not None
    assert rec.exit_code == 0 and not rec.sigkilled and rec.grace_s == 5
    assert rec.exited_at is not None and (rec.exited_at - rec.started_at).total_seconds() > 0.15
    assert not rec.error


async def test_term_past_its_grace_is_sigkilled_and_says_so() -> None:
    procs, started, cuts = [_Proc("reclaimd-0", exits_after=None)], [], []  # type: ignore[var-annotated]
    f = _fault(kind="term", replica=0, at_s=0, grace_s=0.2)
    rec = await faults.apply(f, None, _hooks(procs, started, cuts))  # type: ignore[arg-type]
    assert procs[0].signals == ["TERM", "KILL"] and rec.sigkilled and rec.exit_code == -9
    assert started == [] and rec.ended_at is None  # stopped for good


async def test_partition_cuts_and_heals_the_replicas_proxy() -> None:
    procs, started, cuts = [_Proc("reclaimd-0", None), _Proc("reclaimd-1", None)], [], []  # type: ignore[var-annotated]
    f = _fault(kind="partition", replica=1, at_s=0, for_s=0.1)
    rec = await faults.apply(f, None, _hooks(procs, started, cuts))  # type: ignore[arg-type]
    assert cuts == [(1, True), (1, False)] and rec.connections_cut == 3
    assert rec.successor == "reclaimd-1" and rec.held == {"node-b": "B"}
    assert rec.ended_at is not None and (rec.ended_at - rec.started_at).total_seconds() >= 0.1
    assert procs[1].signals == []  # the process itself is untouched


def test_a_rank_the_drill_stopped_before_it_was_asked_is_not_owed_a_request() -> None:
    def rank(i: int, *, asked: bool, stopped: bool) -> RankFacts:
        return RankFacts(
            pod=f"g-{i}",
            rank=i,
            gpus=8,
            annotated_checkpoint=_at(0),
            started_at=_at(0),
            opted_in=True,
            leader=i == 0,
            saves={"n": _save_facts(_Trainer([], _Server({})), "n", _record())} if asked else {},  # type: ignore[arg-type]
            stopped_at=_at(5) if stopped else None,
        )

    g = GangFacts(
        name="g",
        namespace="ns",
        scope="rank",
        ranks=(
            rank(0, asked=True, stopped=True),  # asked, then stopped: counted
            rank(1, asked=False, stopped=True),  # gone before anyone asked: not owed
            rank(2, asked=False, stopped=False),  # still there and never asked: short
        ),
    )
    assert asked_of(g, "n") == (1, 2)


def test_a_taken_over_notice_is_drained_when_its_last_holder_saw_it_drained() -> None:
    """r0, cut off from the API server, waits blind for pods it cannot see go, until the
    deadline; r1 took the notice over and saw them gone well before it. Without a takeover
    the latest drain of any holder counts, as before."""
    notice = NoticeFacts(
        label="kueue#0", source="kueue", kind="reclaim", target="workload w",
        notice_id="A", response="no_cordon", deadline=_at(30), sent_at=_at(0), gangs=(),
    )  # fmt: skip

    def trace(tid: str, drained: float) -> list[dict[str, Any]]:
        return [
            {"trace_id": tid, "name": "reclaimd.notice", "start_ns": _ns(0.1),
             "end_ns": _ns(drained), "attributes": {"reclaimd.notice.id": "A"}},
            {"trace_id": tid, "name": "reclaimd.drain", "start_ns": _ns(1),
             "end_ns": _ns(drained), "attributes": {}},
        ]  # fmt: skip

    r0, r1 = trace("t0", 30.5), trace("t1", 12)
    cut = _kill(kind="partition", label="partition reclaimd-0@2s", at=2, ended_at=_at(31))
    history = {"w": [_seen(0.2, "r0", "A", 0.2), _seen(10, "r1", "A", 9.5)]}
    taken = _evaluate(
        faults_=[cut], history=history, spans=r0 + r1, by_holder={"r0": r0, "r1": r1},
        notices=[notice],
    )  # fmt: skip
    (row,) = taken.notices
    assert row.drained_at == _at(12) and row.deadline_met
    alone = _evaluate(spans=r0, by_holder={"r0": r0}, notices=[notice])
    (row,) = alone.notices
    assert row.drained_at == _at(30.5) and not row.deadline_met


def test_a_trace_without_its_root_is_found_by_its_ledger_span() -> None:
    """The process died before the notice's root span ended: what it wrote out at the event
    (the ledger span names the notice) is still that notice's trace."""
    spans = [
        {"trace_id": "t", "name": "reclaimd.drain", "start_ns": _ns(1), "attributes": {}},
        {"trace_id": "t", "name": "reclaimd.ledger", "start_ns": _ns(2),
         "attributes": {"reclaimd.notice.id": "A"}},
        {"trace_id": "u", "name": "reclaimd.notice", "start_ns": _ns(5),
         "attributes": {"reclaimd.notice.id": "A"}},
        {"trace_id": "v", "name": "receive x", "start_ns": _ns(0),
         "attributes": {"reclaimd.notice.id": "A"}},  # a transport's: not the notice's trace
    ]  # fmt: skip
    found = index_traces(spans)
    assert sorted({s["trace_id"] for s in found["A"]}) == ["t", "u"]


# --- the window allowed it or not: no replica up -----------------------------------------------


def test_a_miss_while_no_replica_could_act_is_shown_apart_not_counted() -> None:
    """Campaign seed 3974087945: r1 killed for good, r0 paused over the deadline; the notice
    was done 8 s late, after 20 s of its window with nobody to act. With the replica count
    unknown, or a miss longer than that time plus the allowance, it is a miss."""
    notice = NoticeFacts(
        label="kueue#0", source="kueue", kind="reclaim", target="workload w",
        notice_id="A", response="no_cordon", deadline=_at(40), sent_at=_at(10), gangs=(),
    )  # fmt: skip

    def spans(drained: float) -> list[dict[str, Any]]:
        return [
            {"trace_id": "t", "name": "reclaimd.notice", "start_ns": _ns(10.1),
             "end_ns": _ns(drained), "attributes": {"reclaimd.notice.id": "A"}},
            {"trace_id": "t", "name": "reclaimd.drain", "start_ns": _ns(11),
             "end_ns": _ns(drained), "attributes": {}},
        ]  # fmt: skip

    gone = _kill(at=18, holder="r1", label="kill reclaimd-1@18s", replica=1)
    paused = _kill(at=20, kind="pause", label="pause reclaimd-0@20s", replica=0,
                   ended_at=_at(47), successor="r0")  # fmt: skip

    def judge(drained: float, replicas: int) -> Verdict:
        return evaluate(
            scenario="x", run_id="r", expect=Expectations(), notices=[notice], gangs=[],
            observed=Observed(events=[], spans=spans(drained), claims={}),
            faults=[gone, paused], replicas=replicas,
        )  # fmt: skip

    v = judge(48, 2)
    (row,) = v.notices
    assert row.deadline_met is False and row.miss_allowed and not row.missed
    assert row.nobody_up_s == pytest.approx(20.0)
    check = next(c for c in v.checks if c.name == "every deadline met")
    assert check.ok and "kueue#0 (20.0s of its window)" in check.detail
    assert v.summary is not None
    assert (v.summary.deadlines_missed, v.summary.deadlines_nobody_up) == (0, 1)
    assert "late, no replica up 20.0s" in render(v)
    for drained, replicas in ((48, 0), (66, 2)):  # unknown count; 26 s late > 20 + 5
        v = judge(drained, replicas)
        assert v.summary is not None and v.summary.deadlines_missed == 1
        assert not next(c for c in v.checks if c.name == "every deadline met").ok


def test_a_takeover_is_timed_less_the_time_no_replica_could_act() -> None:
    """r0 killed for good at 3 s; its peer r1 was paused 5-20 s and took the claim at 21 s:
    18 s from the fault, 15 of them with nobody up."""
    f = _kill(held={"n1": "A"}, replica=0)
    pause = _kill(at=5, kind="pause", label="pause reclaimd-1@5s", holder="r1", replica=1,
                  ended_at=_at(20), successor="r1")  # fmt: skip
    history = {"n1": [_seen(1, "r0", "A", 1), _seen(22, "r1", "A", 21)]}
    v = _evaluate(faults_=[f, pause], history=history, replicas=2)
    (t,) = v.faults[0].takeovers
    assert t.after_s == pytest.approx(18.0) and t.net_s == pytest.approx(3.0)
    assert v.summary is not None
    assert v.summary.takeover_max_s == pytest.approx(3.0)
    assert v.summary.takeover_raw_max_s == pytest.approx(18.0)


def test_a_peer_that_could_have_taken_over_and_did_not_still_counts() -> None:
    """r1 on a fresh disk from 3 s to 33 s; r0 was up all along and never took over; the
    successor took the claim at 34 s: 31 s, none of it excused."""
    f = _kill(held={"n1": "A"}, holder="r1", kind="fresh_disk", label="fresh_disk reclaimd-1@3s",
              replica=1, ended_at=_at(33), successor="r1b")  # fmt: skip
    history = {"n1": [_seen(1, "r1", "A", 1), _seen(35, "r1b", "A", 34)]}
    v = _evaluate(faults_=[f], history=history, replicas=2)
    (t,) = v.faults[0].takeovers
    assert t.net_s == pytest.approx(31.0) == t.after_s
