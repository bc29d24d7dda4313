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
