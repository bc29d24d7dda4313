"""The fuzz bench's pure parts: the flat-memory rule, where real notices go, the table."""

from __future__ import annotations

import argparse

from chaos import bench_fuzz


def test_memory_is_flat_when_the_last_quarter_stays_near_the_second() -> None:
    steady = [100.0] * 10 + [150.0] * 30
    assert bench_fuzz._flat(steady)["flat"]
    growing = [100.0 + i * 5 for i in range(40)]
    assert not bench_fuzz._flat(growing)["flat"]
    assert not bench_fuzz._flat([1.0, 2.0])["flat"]  # too few samples to say


def test_real_notices_are_spread_among_the_hostile_ones() -> None:
    run = object.__new__(bench_fuzz.FuzzRun)
    run.args = argparse.Namespace(per_transport=10_000)
    at = run._spread("sqs")
    assert len(at) == bench_fuzz.REAL["sqs"]
    assert min(at) > 0 and max(at) < 10_000


def test_bad_arguments_exit_2() -> None:
    assert bench_fuzz.main(["--per-transport", "1"]) == 2
