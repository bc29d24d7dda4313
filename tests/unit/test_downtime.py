"""When the drill's faults left no replica able to act (chaos.drill.downtime): pure."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from chaos.drill import downtime

T0 = datetime.fromisoformat("2026-12-01T12:00:00+00:00")


def _at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


@dataclass(frozen=True)
class _F:
    kind: str
    started_at: datetime
    ended_at: datetime | None
    replica: int | None = None
    holder: str = ""
    successor: str = ""


def _f(kind: str, start: float, end: float | None, replica: int | None = None) -> _F:
    return _F(kind, _at(start), None if end is None else _at(end), replica)


def test_nobody_is_up_only_where_every_replica_is_down() -> None:
    faults = [_f("kill", 18, None, 1), _f("pause", 20, 47, 0)]
    assert downtime.nobody_up(faults, 2) == [(_at(20), _at(47))]
    # a third replica with no fault of its own was up all along
    assert downtime.nobody_up(faults, 3) == []


def test_an_apiserver_restart_stops_everyone_a_kafka_outage_nobody() -> None:
    faults = [_f("restart_apiserver", 5, 9), _f("stop_kafka", 1, 30)]
    assert downtime.nobody_up(faults, 2) == [(_at(5), _at(9))]
    both = [*faults, _f("partition", 8, 12, 0), _f("pause", 10, 11, 1)]
    assert downtime.nobody_up(both, 2) == [(_at(5), _at(9)), (_at(10), _at(11))]


def test_without_a_replica_count_no_time_is_put_down_to_nobody() -> None:
    assert downtime.nobody_up([_f("kill", 1, None, 0)], 0) == []


def test_seconds_within_counts_overlaps_once() -> None:
    spans = [(_at(0), _at(10)), (_at(5), _at(15)), (_at(20), downtime.FOREVER)]
    assert downtime.seconds_within(spans, _at(2), _at(25)) == 13 + 5


def test_a_miss_is_allowed_only_when_nobody_could_act_up_to_its_deadline() -> None:
    # the 3974087945 campaign run: sent 10.31 s, 29.84 s window, charged at 48.02 s, r1 killed
    # for good at 18 s, r0 paused 20-47 s
    sent, deadline = _at(10.31), _at(10.31 + 29.84)
    nobody = [(_at(20), _at(47))]
    allowed, idle = downtime.late_while_nobody_up(deadline, sent, _at(48.02), nobody)
    assert allowed and abs(idle - (40.15 - 20)) < 1e-6
    # done more than the allowance after nobody-up ended: a replica could act meanwhile
    assert not downtime.late_while_nobody_up(deadline, sent, _at(47 + 5.5), nobody)[0]
    # never done, or late with someone up all along: a miss
    assert not downtime.late_while_nobody_up(deadline, sent, None, nobody)[0]
    assert not downtime.late_while_nobody_up(deadline, sent, _at(41), [])[0]


def test_nobody_up_early_in_the_window_does_not_excuse_a_late_finish() -> None:
    """r0 paused 10-20 s with r1 gone: r0 had the last 20 s of a window ending at 40 s."""
    nobody = [(_at(10), _at(20))]
    allowed, idle = downtime.late_while_nobody_up(_at(40), _at(0), _at(52), nobody)
    assert not allowed and idle == 10.0


def test_nobody_up_past_the_deadline_excuses_a_finish_soon_after() -> None:
    nobody = [(_at(35), _at(70))]
    assert downtime.late_while_nobody_up(_at(40), _at(0), _at(71), nobody)[0]


def test_a_notice_on_time_by_its_trace_is_never_excused() -> None:
    """The ledger said the deadline was missed (``x_DeadlineMet`` false): that stands."""
    nobody = [(_at(10), _at(45))]
    assert not downtime.late_while_nobody_up(_at(40), _at(0), _at(39), nobody)[0]


def test_a_stack_fault_that_never_ended_counts_for_nothing() -> None:
    assert downtime.nobody_up([_f("restart_apiserver", 5, None)], 2) == []
