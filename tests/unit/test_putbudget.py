"""Per-rank shares of a tenant's PutObject budget: wire format, allocation, the invariants."""

import bisect
import math
from datetime import UTC, datetime

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from reclaimd.model import Gang, GangKey, Member, Notice, NoticeKind, Target
from reclaimd.putbudget import (
    HEADER,
    MILLI,
    Share,
    TenantPutBudgets,
    parse_field,
    parse_header,
    rank_key,
    tenant_of,
)
from reclaimd_trainer.s3 import TokenBucket

# --- wire format ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "share", [Share(20.0, 20), Share(0.0, 0), Share(0.667, 1), Share(1.0 / 3, 2)]
)
def test_share_round_trips_through_the_header_and_the_field(share: Share) -> None:
    assert parse_header(share.header_value()) == share
    assert parse_field({"put_budget": share.to_json()}) == share


def test_header_format_is_the_documented_one() -> None:
    assert Share(2.5, 3).header_value() == "qps=2.5;burst=3"
    assert HEADER == "X-Reclaimd-Put-Budget"


@pytest.mark.parametrize(
    ("value", "share"),
    [
        ("qps=2.5;burst=3", Share(2.5, 3)),
        (" burst = 3 ; qps = 2.5 ", Share(2.5, 3)),
        ("qps=1;burst=0;", Share(1.0, 0)),
        ("qps=4;burst=2;future=x", Share(4.0, 2)),  # unknown keys leave room to grow
    ],
)
def test_header_parsing_accepts(value: str, share: Share) -> None:
    assert parse_header(value) == share


@pytest.mark.parametrize(
    "value",
    [
        "",
        "qps=2.5",
        "burst=3",
        "qps=fast;burst=3",
        "qps=2;burst=1.5",
        "qps=-1;burst=1",
        "qps=nan;burst=1",
        "qps=inf;burst=1",
        "qps=1;burst=-1",
        "qps=1;qps=2;burst=1",
        "qps 1; burst 1",
        "qps=1;burst=1;" + "x=" + "y" * 200,
    ],
)
def test_header_parsing_refuses_with_one_line(value: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_header(value)
    assert "\n" not in str(err.value)


def test_absent_means_none() -> None:
    assert parse_header(None) is None
    assert parse_field({"notice_id": "n"}) is None
    assert parse_field({"put_budget": None}) is None


@pytest.mark.parametrize(
    "raw",
    [
        "qps=1;burst=1",
        {"qps": "1", "burst": 1},
        {"qps": 1.0, "burst": 1.5},
        {"qps": True, "burst": 1},
        {"qps": 1.0, "burst": False},
        {"qps": 1.0},
        {"qps": -2.0, "burst": 1},
    ],
)
def test_field_parsing_refuses(raw: object) -> None:
    with pytest.raises(ValueError):
        parse_field({"put_budget": raw})


# --- allocation, by example ------------------------------------------------------------------


def test_announced_ranks_split_the_budget_evenly() -> None:
    b = TenantPutBudgets(20.0, 20)
    ranks = [f"r{i}" for i in range(4)]
    b.announce("acme", ranks, now=0.0)
    assert [b.grant("acme", r, now=0.0) for r in ranks] == [Share(5.0, 5)] * 4
    assert b.outstanding("acme") == (20 * MILLI, 20)


def test_more_ranks_than_burst_wait_their_turn_in_deadline_order() -> None:
    b = TenantPutBudgets(20.0, 20)
    late = [f"late{i}" for i in range(20)]
    early = [f"early{i}" for i in range(5)]
    b.announce("acme", late, deadline=100.0, now=0.0)
    b.announce("acme", early, deadline=50.0, now=0.0)
    shares = {r: b.grant("acme", r, now=0.0) for r in late + early}
    # 20 can send at once (one token of burst each), the earliest deadlines first.
    assert all(shares[r] == Share(1.0, 1) for r in early)
    assert [shares[r] for r in late[:15]] == [Share(1.0, 1)] * 15
    assert [shares[r] for r in late[15:]] == [Share(0.0, 0)] * 5
    # One of the early ranks finishes: the next in line is raised at its next poll, with no
    # tokens handed over (the new share only lets them accrue).
    b.release("acme", "early0", now=1.0)
    assert b.refresh("acme", "late15", now=1.2) == Share(1.0, 1)
    assert b.refresh("acme", "late16", now=1.2) == Share(0.0, 0)


def test_a_first_grant_takes_everything_and_gives_it_back_at_its_refresh() -> None:
    b = TenantPutBudgets(20.0, 20)
    assert b.grant("acme", "a", now=0.0) == Share(20.0, 20)
    assert b.grant("acme", "b", now=0.0) == Share(0.0, 0)  # nothing unallocated: wait
    assert b.refresh("acme", "b", now=0.5) == Share(0.0, 0)  # a not lowered yet
    assert b.refresh("acme", "a", now=0.5) == Share(10.0, 10)
    assert b.refresh("acme", "b", now=1.0) == Share(10.0, 10)


def test_release_raises_the_others_and_is_idempotent() -> None:
    b = TenantPutBudgets(20.0, 20)
    b.announce("acme", ["a", "b", "c"], now=0.0)
    for r in "abc":
        b.grant("acme", r, now=0.0)
    b.release("acme", "c", now=1.0)
    b.release("acme", "c", now=1.0)
    assert b.in_flight("acme") == 2
    got = [b.refresh("acme", r, now=1.5) for r in "ab"]
    assert got == [Share(10.0, 10), Share(10.0, 10)]
    assert b.outstanding("acme") == (20 * MILLI, 20)


def test_remainders_go_to_the_earliest_and_sums_are_exact() -> None:
    b = TenantPutBudgets(20.0, 20)
    b.announce("acme", ["a", "b", "c"], now=0.0)
    got = [b.grant("acme", r, now=0.0) for r in "abc"]
    assert got == [Share(6.667, 7), Share(6.667, 7), Share(6.666, 6)]
    assert b.outstanding("acme") == (20 * MILLI, 20)


def test_unknown_rank_waits_and_tenants_are_separate() -> None:
    b = TenantPutBudgets(20.0, 20, budgets={"big": (100.0, 50)})
    assert b.refresh("acme", "nobody") == Share(0.0, 0)
    assert b.grant("acme", "a", now=0.0) == Share(20.0, 20)
    assert b.grant("globex", "a", now=0.0) == Share(20.0, 20)
    assert b.grant("big", "a", now=0.0) == Share(100.0, 50)


def test_regranting_is_a_refresh_not_a_second_share() -> None:
    b = TenantPutBudgets(20.0, 20)
    b.grant("acme", "a", now=0.0)
    assert b.grant("acme", "a", now=0.1) == Share(20.0, 20)
    assert b.outstanding("acme") == (20 * MILLI, 20)


def test_burst_handed_out_is_warm_until_the_tenant_has_been_idle() -> None:
    b = TenantPutBudgets(20.0, 20)  # an empty tenant bucket fills in 20 / 20 = 1 s
    assert b.grant("acme", "a", now=0.0) == Share(20.0, 20)
    b.release("acme", "a", now=5.0)
    # 0.5 s later "a" may just have spent its 20 tokens: no full bucket for "b" yet. It is
    # raised at its poll instead, which hands over no tokens.
    assert b.grant("acme", "b", now=5.5) == Share(0.0, 0)
    assert b.refresh("acme", "b", now=6.0) == Share(20.0, 20)
    b.release("acme", "b", now=6.0)
    assert b.grant("acme", "c", now=7.0) == Share(20.0, 20)  # idle 1 s: cold again


def test_budget_settings_are_checked() -> None:
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError):
            TenantPutBudgets(bad)
    with pytest.raises(ValueError):
        TenantPutBudgets(20.0, 0)
    with pytest.raises(ValueError):
        TenantPutBudgets(20.0, idle_reset_s=-1.0)
    assert TenantPutBudgets(2.5).budget("acme") == Share(2.5, 3)


# --- the invariants, for any sequence of calls ----------------------------------------------

_op = st.tuples(
    st.sampled_from(["announce", "grant", "refresh", "release"]),
    st.integers(0, 2),  # tenant
    st.integers(0, 40),  # rank
    st.floats(0.0, 0.6),  # time passing before the call
    st.one_of(st.none(), st.floats(0.0, 100.0)),  # deadline
)


@settings(max_examples=300, deadline=None)
@given(
    qps=st.floats(0.5, 200.0),
    burst=st.integers(1, 40),
    ops=st.lists(_op, max_size=300),
)
def test_handed_out_shares_never_exceed_the_budget(
    qps: float, burst: int, ops: list[tuple[str, int, int, float, float | None]]
) -> None:
    b = TenantPutBudgets(qps, burst)
    budget_milli = math.floor(qps * MILLI)
    held: dict[tuple[str, int], Share] = {}
    now = 0.0
    for op, tenant_no, rank, dt, deadline in ops:
        now += dt
        tenant = f"t{tenant_no}"
        if op == "announce":
            b.announce(tenant, [rank, rank + 1], deadline=deadline, now=now)
        elif op == "grant":
            held[(tenant, rank)] = b.grant(tenant, rank, deadline=deadline, now=now)
        elif op == "refresh":
            share = b.refresh(tenant, rank, now=now)
            if (tenant, rank) in held:
                held[(tenant, rank)] = share
        else:
            b.release(tenant, rank, now=now)
            held.pop((tenant, rank), None)
        for t in {k[0] for k in held} | {tenant}:
            mine = [s for (tt, _), s in held.items() if tt == t]
            # Shares are whole milli-PutObject/s, so this sum is exact.
            assert sum(round(s.qps * MILLI) for s in mine) <= budget_milli
            assert sum(s.burst for s in mine) <= burst
            assert all(s.burst >= 1 for s in mine if s.qps > 0)  # a rate never goes unheld
            assert b.outstanding(t) == (
                sum(round(s.qps * MILLI) for s in mine),
                sum(s.burst for s in mine),
            )


@settings(max_examples=200, deadline=None)
@given(
    qps=st.floats(0.5, 200.0),
    burst=st.integers(1, 40),
    ranks=st.integers(1, 60),
    released=st.sets(st.integers(0, 59)),
)
def test_two_rounds_of_polls_hand_out_the_whole_budget(
    qps: float, burst: int, ranks: int, released: set[int]
) -> None:
    b = TenantPutBudgets(qps, burst)
    ids = list(range(ranks))
    for r in ids:  # one at a time, no announce: the first ones take too much at first
        b.grant("acme", r, now=0.0)
    for r in released:
        b.release("acme", r, now=0.1)
    left = [r for r in ids if r not in released]
    for _ in range(2):
        shares = [b.refresh("acme", r, now=0.5) for r in left]
    if not left:
        return
    budget_milli = math.floor(qps * MILLI)
    k = min(len(left), burst, budget_milli)
    assert sum(round(s.qps * MILLI) for s in shares) == budget_milli
    assert sum(s.burst for s in shares) == burst
    assert sum(1 for s in shares if not s.waits) == k


# --- what the tenant actually sends: the buckets of all its ranks together -------------------


def _most_in_window(times: list[float], window: float) -> int:
    times = sorted(times)
    return max(
        (bisect.bisect_right(times, t + window) - i for i, t in enumerate(times)), default=0
    )


@settings(max_examples=150, deadline=None)
@given(
    qps=st.sampled_from([5.0, 20.0, 37.5]),
    burst=st.integers(1, 25),
    events=st.lists(
        st.tuples(st.sampled_from(["grant", "grant", "refresh", "release"]), st.integers(0, 10)),
        min_size=1,
        max_size=120,
    ),
)
# A rank that finishes right after its full start must not hand a full bucket to the next.
@example(qps=20.0, burst=20, events=[("grant", 0), ("release", 0), ("grant", 1)])
def test_all_ranks_together_stay_inside_burst_plus_rate(
    qps: float, burst: int, events: list[tuple[str, int]]
) -> None:
    """Each rank's pod bucket starts full at its own limit and takes every share with the
    guarded put's clamping rule; every rank always has something to send. Whatever the order of
    grants, polls and releases, the sends in any window of T s stay <= burst + qps x T."""
    own_rate, own_burst = 50.0, 50.0  # the pods' own guard limits, above any share here
    b = TenantPutBudgets(qps, burst)
    buckets: dict[int, TokenBucket] = {}
    sends: list[float] = []
    tick, now = 0.01, 0.0

    def pace(until: float) -> None:
        nonlocal now
        while now < until:
            now = round(now + tick, 6)
            for bucket in buckets.values():
                while bucket.take(now) == 0.0:
                    sends.append(now)

    for op, rank in events:
        if op == "grant" and rank not in buckets:
            share = b.grant("acme", rank, now=now)
            buckets[rank] = TokenBucket(own_rate, own_burst, now)
            buckets[rank].set_rate(share.qps, float(share.burst), now)
        elif op == "refresh" and rank in buckets:
            share = b.refresh("acme", rank, now=now)
            buckets[rank].set_rate(share.qps, float(share.burst), now)
        elif op == "release" and rank in buckets:
            b.release("acme", rank, now=now)
            del buckets[rank]
        pace(now + 0.15)
    pace(now + 2.0)
    for window in (0.25, 1.0, 3.0):
        assert _most_in_window(sends, window) <= burst + qps * window + 1e-6


# --- whose budget ----------------------------------------------------------------------------


def _gang(labels: dict[str, str]) -> Gang:
    m = Member(namespace="team-a", name="llama-0", uid="uid-0", node="n1", gpus=8)
    return Gang(key=GangKey("jobset", "team-a", "llama"), members=(m,), labels=labels)


@pytest.mark.parametrize(
    ("labels", "tenant"),
    [
        ({"tenant": "acme"}, "acme"),
        ({}, "team-a"),
        ({"tenant": ""}, "team-a"),
        ({"tenant": "not a tenant!"}, "team-a"),
        ({"tenant": "x" * 64}, "team-a"),
    ],
)
def test_the_tenant_is_the_cost_label_else_the_namespace(
    labels: dict[str, str], tenant: str
) -> None:
    assert tenant_of(_gang(labels)) == tenant


def test_a_rank_is_keyed_per_notice() -> None:
    gang = _gang({})
    now = datetime(2026, 3, 1, tzinfo=UTC)
    notice = Notice(
        id="ec2-1",
        source="ec2",
        kind=NoticeKind.SPOT_INTERRUPTION,
        target=Target(node_name="n1"),
        issued_at=now,
        deadline=now,
        received_at=now,
    )
    assert rank_key(notice, gang.members[0]) == ("ec2-1", "uid-0")
