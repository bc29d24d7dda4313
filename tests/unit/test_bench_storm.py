"""The storm bench's arithmetic: the minimum the arrivals allow, receipts from span files."""

import json
from pathlib import Path

import pytest

from chaos.bench import storm as bench_storm


def test_the_minimum_is_the_write_rate_when_all_arrive_at_once() -> None:
    assert bench_storm.earliest_all_cordoned([0.0] * 300, 300.0) == pytest.approx(1.0)


def test_the_minimum_follows_the_last_arrival_when_writes_keep_up() -> None:
    arrivals = [i * 0.5 for i in range(11)]  # one notice every 0.5 s for 5 s
    assert bench_storm.earliest_all_cordoned(arrivals, 100.0) == pytest.approx(5.01)


def test_receipts_are_the_earliest_root_span_start_per_notice(tmp_path: Path) -> None:
    spans = [
        {
            "name": "reclaimd.notice",
            "start_ns": 2_000_000_000,
            "attributes": {"reclaimd.notice.id": "a"},
        },
        {
            "name": "reclaimd.notice",
            "start_ns": 1_000_000_000,
            "attributes": {"reclaimd.notice.id": "a"},
        },
        {"name": "reclaimd.claim", "start_ns": 0, "attributes": {"reclaimd.notice.id": "b"}},
    ]
    f = tmp_path / "spans.jsonl"
    f.write_text("\n".join(json.dumps(s) for s in spans) + "\nnot json\n")
    assert bench_storm.receipts([str(f), str(tmp_path / "missing.jsonl")]) == {"a": 1.0}
