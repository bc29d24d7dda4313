from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from reclaimd import checkpoint
from reclaimd.model import (
    CheckpointOutcome,
    CheckpointScope,
    Gang,
    GangKey,
    Member,
    Notice,
    NoticeKind,
    RankAck,
    Target,
    stable_id,
)
from reclaimd.waste import NodeLoss, build_restart_waste, by_node, gpu_seconds_lost

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
STOP = T0 + timedelta(hours=1)
URL = "http://10.0.0.1:8080/checkpoint"


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def member(
    name: str,
    gpus: int,
    *,
    ckpt: datetime | None = None,
    started: datetime | None = None,
    url: str = URL,
    leader: bool = False,
) -> Member:
    return Member(
        namespace="team-a",
        name=name,
        uid=f"uid-{name}",
        node=f"node-{name}",
        gpus=gpus,
        checkpoint_url=url,
        last_checkpoint=ckpt,
        started_at=started,
        is_leader=leader,
    )


def gang(*members: Member, scope: CheckpointScope = CheckpointScope.RANK) -> Gang:
    return Gang(GangKey("jobset", "team-a", "llm"), members, scope)


def notice(nid: str = "aws-1") -> Notice:
    return Notice(
        nid,
        "aws.sqs",
        NoticeKind.SPOT_INTERRUPTION,
        Target(instance_id="i-1"),
        at(58),
        STOP,
        at(58),
    )


def ack(m: Member, *, durable: bool, when: datetime | None, acked: bool = True) -> RankAck:
    return RankAck(member=m, acked=acked, durable=durable, checkpoint_time=when)


# --- gpu_seconds_lost ------------------------------------------------------------------


def test_ranks_with_different_gpu_counts_are_weighted() -> None:
    ms = [member("r0", 8, ckpt=at(30)), member("r1", 4, ckpt=at(45))]
    # 8 GPUs x 30 min + 4 GPUs x 15 min
    assert gpu_seconds_lost(ms, STOP) == 8 * 1800 + 4 * 900


def test_rank_without_checkpoint_counts_from_pod_start() -> None:
    ms = [member("r0", 2, started=at(10))]
    assert gpu_seconds_lost(ms, STOP) == 2 * 50 * 60


def test_checkpoint_older_than_pod_start_counts_from_the_start() -> None:
    # The pod restarted after its last checkpoint: the gap before belongs to an earlier event.
    ms = [member("r0", 1, ckpt=at(5), started=at(20))]
    assert gpu_seconds_lost(ms, STOP) == 40 * 60


def test_rank_knowing_no_time_counts_zero() -> None:
    assert gpu_seconds_lost([member("r0", 8)], STOP) == 0.0


def test_checkpoint_after_stop_is_clamped_not_negative() -> None:
    ms = [member("r0", 8, ckpt=STOP + timedelta(seconds=5)), member("r1", 1, ckpt=at(59))]
    assert gpu_seconds_lost(ms, STOP) == 60.0


# --- build_restart_waste ---------------------------------------------------------------


def test_durable_ack_resets_the_clock_and_non_durable_does_not() -> None:
    r0 = member("r0", 8, ckpt=at(0))
    r1 = member("r1", 8, ckpt=at(0))
    acks = [ack(r0, durable=True, when=at(59)), ack(r1, durable=False, when=at(59.5))]
    w = build_restart_waste(notice(), gang(r0, r1), acks, STOP, deadline_met=True)
    assert w.gpu_seconds_lost == 8 * 60 + 8 * 3600
    assert w.outcome is CheckpointOutcome.NOT_DURABLE
    assert [m.last_checkpoint for m in w.gang.members] == [at(59), at(0)]
    assert w.last_good_checkpoint == at(0)


def test_all_durable_is_checkpointed() -> None:
    r0, r1 = member("r0", 4, ckpt=at(0)), member("r1", 4, ckpt=at(0))
    acks = [ack(r0, durable=True, when=at(59)), ack(r1, durable=True, when=at(59))]
    w = build_restart_waste(notice(), gang(r0, r1), acks, STOP, deadline_met=True)
    assert w.outcome is CheckpointOutcome.CHECKPOINTED
    assert w.gpu_seconds_lost == 2 * 4 * 60
    assert w.last_good_checkpoint == at(59)


def test_older_ack_does_not_move_the_clock_back() -> None:
    r0 = member("r0", 1, ckpt=at(50))
    w = build_restart_waste(
        notice(), gang(r0), [ack(r0, durable=True, when=at(10))], STOP, deadline_met=True
    )
    assert w.gpu_seconds_lost == 600


def test_durable_ack_without_time_does_not_reset() -> None:
    r0 = member("r0", 1, ckpt=at(0))
    w = build_restart_waste(
        notice(), gang(r0), [ack(r0, durable=True, when=None)], STOP, deadline_met=False
    )
    assert w.gpu_seconds_lost == 3600
    assert w.outcome is CheckpointOutcome.NOT_DURABLE
    assert w.deadline_met is False


def test_some_ranks_acked_is_partial() -> None:
    r0, r1 = member("r0", 1, ckpt=at(0)), member("r1", 1, ckpt=at(0))
    acks = [ack(r0, durable=True, when=at(59)), ack(r1, durable=False, when=None, acked=False)]
    w = build_restart_waste(notice(), gang(r0, r1), acks, STOP, deadline_met=True)
    assert w.outcome is CheckpointOutcome.PARTIAL
    assert w.gpu_seconds_lost == 60 + 3600


def test_no_ack_and_not_opted_in() -> None:
    r0 = member("r0", 1, ckpt=at(0))
    w = build_restart_waste(notice(), gang(r0), [], STOP, deadline_met=True)
    assert w.outcome is CheckpointOutcome.NO_ACK
    silent = member("r0", 1, ckpt=at(0), url="")
    w = build_restart_waste(notice(), gang(silent), [], STOP, deadline_met=True)
    assert w.outcome is CheckpointOutcome.NOT_OPTED_IN
    assert w.gpu_seconds_lost == 3600


def test_leader_ack_covers_every_rank() -> None:
    lead = member("r0", 8, ckpt=at(0), leader=True)
    rest = member("r1", 8, ckpt=at(0), url="")
    g = gang(lead, rest, scope=CheckpointScope.LEADER)
    w = build_restart_waste(
        notice(), g, [ack(lead, durable=True, when=at(59))], STOP, deadline_met=True
    )
    assert w.outcome is CheckpointOutcome.CHECKPOINTED
    assert w.gpu_seconds_lost == 2 * 8 * 60


def test_leader_scope_ignores_a_follower_ack() -> None:
    lead = member("r0", 1, ckpt=at(0), leader=True)
    follower = member("r1", 1, ckpt=at(0))
    g = gang(lead, follower, scope=CheckpointScope.LEADER)
    w = build_restart_waste(
        notice(), g, [ack(follower, durable=True, when=at(59))], STOP, deadline_met=True
    )
    assert w.outcome is CheckpointOutcome.NO_ACK
    assert w.gpu_seconds_lost == 2 * 3600


def test_event_id_is_stable_per_notice_and_gang() -> None:
    g = gang(member("r0", 1, ckpt=at(0)))
    a = build_restart_waste(notice("n1"), g, [], STOP, deadline_met=True)
    b = build_restart_waste(notice("n1"), g, [], STOP + timedelta(seconds=3), deadline_met=False)
    c = build_restart_waste(notice("n2"), g, [], STOP, deadline_met=True)
    assert a.event_id == b.event_id == stable_id("rw", "n1", "jobset:team-a/llm")
    assert a.event_id != c.event_id


@pytest.mark.parametrize("gpus", [0, 1, 8])
def test_waste_scales_with_gpus(gpus: int) -> None:
    assert gpu_seconds_lost([member("r0", gpus, ckpt=at(0))], STOP) == gpus * 3600


# --- the split by node ---------------------------------------------------------------------


def test_by_node_groups_ranks_and_sums_to_the_total() -> None:
    a = replace(member("r0", 8, ckpt=at(30)), node="spot-1")
    b = replace(member("r1", 4, ckpt=at(45)), node="od-1")
    c = replace(member("r2", 2, started=at(50)), node="spot-1")
    parts = by_node([a, b, c], STOP)
    assert parts == (
        NodeLoss("od-1", ranks=1, gpus=4, gpu_seconds=4 * 900),
        NodeLoss("spot-1", ranks=2, gpus=10, gpu_seconds=8 * 1800 + 2 * 600),
    )
    assert sum(p.gpu_seconds for p in parts) == gpu_seconds_lost([a, b, c], STOP)


def test_a_leader_gone_before_a_takeover_still_speaks_through_its_recorded_ack() -> None:
    """A successor's gang has the leader from the gang record: no URL (its pod is gone), and
    the durable ack the dead owner recorded. That save covers the gang, as it did for the
    owner (failover-4253230685: charged 995 GPU-s from the older checkpoint, true 0.5)."""
    gone = member("r0", 2, ckpt=at(0), url="", leader=True)
    g = gang(gone, scope=CheckpointScope.LEADER)
    w = build_restart_waste(
        notice(), g, [ack(gone, durable=True, when=at(59))], STOP, deadline_met=True
    )
    assert w.outcome is CheckpointOutcome.CHECKPOINTED
    assert w.gpu_seconds_lost == 2 * 60
    # The same gang with its leader's pod gone but a follower still asked: the leader speaks.
    follower = member("r1", 2, ckpt=at(0))
    g2 = gang(gone, follower, scope=CheckpointScope.LEADER)
    acks = [ack(gone, durable=True, when=at(59)), ack(follower, durable=False, when=None)]
    w2 = build_restart_waste(notice(), g2, acks, STOP, deadline_met=True)
    assert w2.outcome is CheckpointOutcome.CHECKPOINTED
    assert w2.gpu_seconds_lost == 2 * 2 * 60
    # Nobody answered and nobody opted in: as before.
    w3 = build_restart_waste(notice(), g, [], STOP, deadline_met=True)
    assert w3.outcome is CheckpointOutcome.NOT_OPTED_IN


def test_a_followers_later_save_does_not_replace_a_gone_leaders_recorded_ack() -> None:
    """failover-4020099555: the leader acked durable and was evicted, its owner was killed
    before the follower's eviction; resumed, the run asked the follower (the leader's pod was
    gone) and copied its later save onto the leader. The leader's own recorded save is the
    gang's: the charge starts there (8 GPUs x 10 min), not at the follower's save."""
    gone = member("r0", 4, ckpt=at(0), url="", leader=True)
    follower = member("r1", 4, ckpt=at(0))
    g = gang(gone, follower, scope=CheckpointScope.LEADER)
    recorded = [ack(gone, durable=True, when=at(50))]
    said = ack(follower, durable=True, when=at(58))
    fresh = [checkpoint._covered(gone, said, "team-a/r1"), said]
    acks = checkpoint.merge_acks(fresh, recorded)
    w = build_restart_waste(notice(), g, acks, STOP, deadline_met=True)
    assert w.gpu_seconds_lost == 8 * 600
    assert next(a for a in acks if a.member.uid == gone.uid).covered_by == ""
    # a recorded copy (the leader's answer recorded for a follower) is still replaced by a
    # newer one: only a rank's own save outranks a copy
    copied = checkpoint._covered(follower, recorded[0], "team-a/r0")
    newer = checkpoint._covered(follower, ack(gone, durable=True, when=at(55)), "team-a/r0")
    merged = checkpoint.merge_acks([newer], [copied])
    assert merged[0].checkpoint_time == at(55)
