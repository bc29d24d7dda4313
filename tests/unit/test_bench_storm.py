"""The storm bench's arithmetic: the minimum the arrivals allow, receipts from span files,
reclaimd's receive rate against a plain consumer's, and the intake storms' scenarios."""

import json
from pathlib import Path

import pytest

from chaos.bench import intake
from chaos.bench import storm as bench_storm

SCENARIOS = Path(__file__).resolve().parents[2] / "chaos" / "scenarios"


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


def test_reclaimd_receive_rate_counts_intervals_between_first_and_last_receipt() -> None:
    got = intake.received_rate([10.0, 10.5, 11.0, 12.0, 14.0])
    assert got == {"received": 5, "first_to_last_s": 4.0, "received_per_s": 1.0}


@pytest.mark.parametrize("receipts", [[], [3.0], [3.0, 3.0]])
def test_no_receive_rate_without_a_span_of_time(receipts: list[float]) -> None:
    assert intake.received_rate(receipts)["received_per_s"] is None


def test_the_comparison_is_reclaimd_over_plain() -> None:
    got = intake.compare({"received_per_s": 40.0}, {"received_per_s": 30.0})
    assert got == {"plain_per_s": 40.0, "reclaimd_per_s": 30.0, "reclaimd_to_plain": 0.75}
    assert intake.compare({"received_per_s": 39470.5}, {"received_per_s": 5.1})[
        "reclaimd_to_plain"
    ] == pytest.approx(0.000129)
    failed = intake.compare({"error": "boom"}, {"received_per_s": 30.0})
    assert failed["reclaimd_to_plain"] is None and failed["reclaimd_per_s"] == 30.0


def test_the_table_puts_plain_and_reclaimd_side_by_side_and_says_a_failed_calibration() -> None:
    plain = {
        "kafka": {
            "transport": "kafka",
            "consumer": "one consumer",
            "messages": 1000,
            "all_received_s": 0.5,
            "received_per_s": 2000.0,
        },
        "pubsub": {"transport": "pubsub", "error": "NotFound: topic"},
    }
    reclaimd = {
        "received": 1000,
        "first_to_last_s": 1.998,
        "received_per_s": 500.0,
        "sent_first_to_last_s": 0.999,
    }
    lines = bench_storm.intake_lines(plain, reclaimd)
    assert lines[1] == (
        "intake kafka: plain 2000.0/s vs reclaimd received 1000 in 1.998 s: 500.0/s"
        " (0.25x plain; sent over 0.999 s)"
    )
    assert lines[2] == "intake pubsub: calibration failed: NotFound: topic"


@pytest.mark.parametrize(
    ("scenario", "source", "calibrated"),
    [
        ("kafka-storm-1000", "kafka", "kafka"),
        ("pubsub-storm-1000", "gke-pubsub", "pubsub"),
        ("spot-storm-1000-notices", "ec2-sqs", "sqs"),
    ],
)
def test_the_storms_differ_only_in_their_intake(
    scenario: str, source: str, calibrated: str
) -> None:
    from chaos.drill import scenario as scenarios

    path = SCENARIOS / f"{scenario}.yaml"
    assert bench_storm.scenario_sources(path) == {source}
    assert intake.CALIBRATED[source] == calibrated
    loaded, base = scenarios.load(path), scenarios.load(SCENARIOS / "spot-storm-1000-notices.yaml")
    (group,) = loaded.notices
    assert (group.target.count, group.spread_s) == (1000, 1)
    assert sum(p.count for p in loaded.cluster.pools) == 1000
    assert loaded.gangs == base.gangs and loaded.reclaimd.replicas == 2
    # every deadline the SQS storm's two minutes (kafka: the event's own deadline)
    windows = loaded.reclaimd.the_windows
    window = {
        "kafka": group.window_s,
        "gke-pubsub": windows.of("gce_preemption_s", {"gce_preemption_s": 30.0}),
        "ec2-sqs": windows.of("ec2_spot_s", {"ec2_spot_s": 0.0}),
    }[source]
    assert window == pytest.approx(120.0)


def test_the_summary_carries_reclaimd_receive_rate_and_the_takeovers(tmp_path: Path) -> None:
    spans = tmp_path / "spans.jsonl"
    spans.write_text(
        "\n".join(
            json.dumps(
                {
                    "name": "reclaimd.notice",
                    "start_ns": int((100 + i) * 1e9),
                    "attributes": {"reclaimd.notice.id": f"n{i}"},
                }
            )
            for i in range(3)
        )
        + "\n"
    )
    notices = [
        {
            "notice_id": f"n{i}",
            "response": "full",
            "sent_at": "1970-01-01T00:01:39Z",
            "cordoned_at": f"1970-01-01T00:01:4{i + 1}Z",
            "deadline_met": True,
        }
        for i in range(3)
    ]
    drill = {
        "notices": notices,
        "span_files": [str(spans)],
        "summary": {
            "lost": 0,
            "doubled": 0,
            "takeovers": 2,
            "live_takeovers": 1,
            "fenced_actions": 4,
        },
        "daemons": {"r0": {"kube_writes": {"write claim on node": 6}, "peak_rss_mb": 150.0}},
    }
    s = bench_storm.summarize({"max_writes_per_s": 3.0}, drill)
    assert s["intake"] == {
        "received": 3,
        "first_to_last_s": 2.0,
        "received_per_s": 1.0,
        "sent_first_to_last_s": 0.0,
    }
    assert (s["takeovers"], s["live_takeovers"], s["fenced_actions"], s["lost"]) == (2, 1, 4, 0)
    assert s["all_cordoned_s"] == 4.0 and s["physical_min_all_cordoned_s"] == 1.0
    assert s["ratio_to_physical_min"] == 4.0 and s["writes_per_doomed_node"] == 2.0
    assert s["receipt_to_cordoned_s"]["p50"] == 1.0  # each cordoned 1 s after receipt
    assert s["peak_rss_mb"] == {"r0": 150.0} and s["deadlines_met"] == 3
