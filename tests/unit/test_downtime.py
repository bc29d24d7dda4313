"""When the drill's faults left no replica able to act (chaos.downtime): pure."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from reclaimd.chaos import downtime

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


def test_a_miss_is_allowed_only_as_long_as_nobody_could_act_plus_the_allowance() -> None:
    nobody = [(_at(20), _at(47))]
    # the 3974087945 campaign run: sent 10.31 s, 29.84 s window, charged at 48.02 s
    sent, deadline = _at(10.31), _at(10.31 + 29.84)
    allowed, idle = downtime.late_while_nobody_up(deadline, sent, _at(48.02), nobody)
    assert allowed and abs(idle - (40.15 - 20)) < 1e-6
    late = deadline + timedelta(seconds=idle + downtime.TAKEOVER_ALLOWANCE_S + 0.5)
    assert downtime.late_while_nobody_up(deadline, sent, late, nobody)[0] is False
    # never done, or late with someone up all along: a miss
    assert downtime.late_while_nobody_up(deadline, sent, None, nobody)[0] is False
    assert downtime.late_while_nobody_up(deadline, sent, _at(41), [])[0] is False


def test_holders_map_to_their_replica() -> None:
    f = _F("fresh_disk", _at(1), _at(2), 1, holder="a", successor="b")
    assert downtime.replica_of([f, _F("stop_kafka", _at(1), _at(2))]) == {"a": 1, "b": 1}
