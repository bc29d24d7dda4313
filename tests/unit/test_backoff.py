"""The one jittered backoff: bounds, growth, cap, reset (seeded RNG, no clocks)."""

from __future__ import annotations

import random

import pytest

from reclaimd.backoff import Backoff


def test_delays_stay_under_a_doubling_ceiling_up_to_the_cap() -> None:
    b = Backoff(1.0, 30.0, random.Random(7))
    ceilings = []
    for _ in range(12):
        ceiling = b.ceiling()
        delay = b.next_delay()
        assert 0 <= delay <= ceiling
        ceilings.append(ceiling)
    assert ceilings[:6] == [1, 2, 4, 8, 16, 30]
    assert set(ceilings[5:]) == {30.0}


def test_the_delays_are_jittered_not_fixed() -> None:
    b = Backoff(1.0, 8.0, random.Random(1))
    for _ in range(3):
        b.next_delay()
    at_cap = [b.next_delay() for _ in range(50)]
    assert len(set(at_cap)) == 50  # full jitter: no two replicas wake together
    assert min(at_cap) < 4 < max(at_cap)


def test_a_seeded_backoff_repeats_itself() -> None:
    a = Backoff(0.5, 10.0, random.Random(42))
    b = Backoff(0.5, 10.0, random.Random(42))
    assert [a.next_delay() for _ in range(8)] == [b.next_delay() for _ in range(8)]


def test_reset_starts_the_series_over() -> None:
    b = Backoff(1.0, 60.0, random.Random(3))
    for _ in range(5):
        b.next_delay()
    assert b.ceiling() == 32
    b.reset()
    assert b.failures == 0 and b.ceiling() == 1


def test_a_floor_keeps_a_minimum_pause() -> None:
    b = Backoff(1.0, 4.0, random.Random(5), floor_s=0.5)
    assert min(b.next_delay() for _ in range(200)) >= 0.5


def test_a_long_outage_does_not_overflow() -> None:
    b = Backoff(1.0, 30.0, random.Random(0))
    b.failures = 10_000
    assert 0 <= b.next_delay() <= 30


@pytest.mark.parametrize(("base", "cap", "floor"), [(0, 1, 0), (2, 1, 0), (1, 2, 3), (1, 2, -1)])
def test_nonsense_bounds_are_refused(base: float, cap: float, floor: float) -> None:
    with pytest.raises(ValueError, match="backoff"):
        Backoff(base, cap, floor_s=floor)


async def test_sleep_sleeps_the_next_delay() -> None:
    b = Backoff(0.001, 0.002, random.Random(9))
    slept = await b.sleep()
    assert 0 <= slept <= 0.001 and b.failures == 1


def test_the_policies_of_the_retry_loops_keep_their_figures() -> None:
    """The write budget (full jitter, at least Retry-After), evictions a PDB refuses (half
    jitter, a cap that grows with the time left, the hint bounded by the cap) and the ledger's
    publisher (half jitter, 0.5 s doubling to 30 s) take their delays from one policy."""
    from reclaimd.backoff import RetryPolicy
    from reclaimd.cluster import errors

    rng = random.Random(11)
    writes = RetryPolicy(0.2, 5.0)
    assert [writes.ceiling(n) for n in range(1, 7)] == [0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    assert all(0 <= writes.delay(3, rng) < 1.6 for _ in range(200))
    assert writes.delay(1, rng, hint_s=7.0) == 7.0
    assert writes.allows(1.0, 99, left_s=1.5, max_attempts=8)
    assert not writes.allows(1.5, 1, left_s=1.5, max_attempts=8)
    assert writes.allows(1.0, 7, left_s=None, max_attempts=8)
    assert not writes.allows(1.0, 8, left_s=None, max_attempts=8)
    evictions = RetryPolicy(0.5, 5.0, jitter="half")
    assert all(2.0 <= evictions.delay(3, rng) <= 4.0 for _ in range(200))
    assert all(8.0 <= evictions.delay(9, rng, cap_s=16.0) <= 16.0 for _ in range(200))
    assert evictions.delay(1, rng, hint_s=min(60.0, 5.0)) == 5.0
    publisher = Backoff(0.5, 30.0, random.Random(2), jitter="half")
    ceilings = []
    for _ in range(8):
        ceiling = publisher.ceiling()
        assert ceiling / 2 <= publisher.next_delay() <= ceiling
        ceilings.append(ceiling)
    assert ceilings == [0.5, 1, 2, 4, 8, 16, 30, 30]
    # The write budget retries what the error itself calls transient (a 403 for a grace).
    retried = {c.__name__ for c in (errors.Throttled, errors.ServerError) if c.transient}
    assert retried == {"Throttled", "ServerError"}
    assert not errors.TooManyRequests.transient and not errors.Conflict.transient
    assert errors.Forbidden.retried_in_grace and not errors.Unauthorized.retried_in_grace
