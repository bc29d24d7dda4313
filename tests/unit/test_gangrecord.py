"""The gang's durable record on its Lease: what a successor reads back."""

from datetime import UTC, datetime, timedelta

import pytest

from reclaimd.cluster import gangrecord
from reclaimd.model import CheckpointScope, Gang, GangKey, Member, ParseError, RankAck

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
GANG = Gang(
    GangKey("jobset", "team-a", "pretrain-3"),
    (
        Member("team-a", "p-0", "u0", "n1", 4, rank=0, last_checkpoint=T0, is_leader=True),
        Member("team-a", "p-1", "u1", "n2", 4, rank=1, started_at=T0 - timedelta(hours=1)),
    ),
    scope=CheckpointScope.LEADER,
    labels={"tenant": "team-a"},
)


def test_the_gang_round_trips_without_what_it_need_not_keep() -> None:
    back = gangrecord.gang_from_json(gangrecord.gang_json(GANG))
    assert back.key == GANG.key and back.scope is CheckpointScope.LEADER
    assert dict(back.labels) == {"tenant": "team-a"}
    assert back.members == GANG.members  # checkpoint URLs are not part of a member here


def test_a_gang_too_big_for_a_lease_is_not_recorded() -> None:
    big = Gang(GANG.key, tuple(Member("ns", f"p-{i:05d}", f"u{i}", "n", 8) for i in range(2000)))
    assert gangrecord.gang_json(big) == ""


def test_only_durable_acks_are_recorded_and_they_come_back_on_the_members() -> None:
    m0, m1 = GANG.members
    acks = (RankAck(m0, True, True, T0, step=7, uri="s3://b/k"), RankAck(m1, True, False, T0))
    back = gangrecord.acks_from_json(gangrecord.acks_json(acks), GANG)
    assert len(back) == 1 and back[0].member == m0
    assert back[0].durable and back[0].checkpoint_time == T0 and back[0].step == 7


def test_an_unreadable_record_is_a_parse_error() -> None:
    with pytest.raises(ParseError):
        gangrecord.gang_from_json('{"key": 1}')
    with pytest.raises(ParseError):
        gangrecord.acks_from_json("[1]", GANG)
