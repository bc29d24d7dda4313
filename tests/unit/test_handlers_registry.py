"""The source registry (handlers/__init__.py) and the shared readers (handlers/fields.py)."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
from shared_fixtures import FIXTURES as SHARED

from reclaimd import handlers
from reclaimd.handlers import fields
from reclaimd.handlers.sqs import parser as ec2_spot
from reclaimd.model import ParseError, Windows

FIXTURES = SHARED
RECEIVED = datetime(2025, 1, 1, 12, 0, 5, tzinfo=UTC)


def test_registry_names_every_source() -> None:
    assert set(handlers.PARSERS) == {e.name for e in handlers.REGISTRY}
    names = {"sqs", "imds", "pubsub", "gce_metadata", "kueue", "kafka_notices"}
    assert names <= set(handlers.PARSERS)


def test_parse_dispatches_by_source_name_with_default_windows() -> None:
    payload = (FIXTURES / "aws" / "eventbridge-spot-interruption-warning.json").read_bytes()
    via_registry = handlers.parse("sqs", payload, received_at=RECEIVED)
    direct = ec2_spot.parse(payload, received_at=RECEIVED, windows=Windows())
    assert via_registry == direct


def test_parse_passes_the_windows_on() -> None:
    payload = (FIXTURES / "aws" / "eventbridge-spot-interruption-warning.json").read_bytes()
    out = handlers.parse("sqs", payload, received_at=RECEIVED, windows=Windows(ec2_spot_s=5))
    assert isinstance(out, tuple)
    assert out[0].deadline == datetime(2025, 1, 1, 12, 0, 5, tzinfo=UTC)


def test_unknown_source_is_a_parse_error() -> None:
    known = ", ".join(sorted(handlers.PARSERS))
    with pytest.raises(ParseError, match=re.escape(f"unknown source 'nosuch'; known: {known}")):
        handlers.parse("nosuch", b"{}", received_at=RECEIVED)


def test_a_payload_for_another_source_is_a_parse_error() -> None:
    payload = (
        FIXTURES / "kueue" / "workload-v1beta2-reclaim-preempted-t0-evicted.json"
    ).read_bytes()
    for source in sorted(set(handlers.PARSERS) - {"kueue"}):
        with pytest.raises(ParseError):
            handlers.parse(source, payload, received_at=RECEIVED)


# --- fields ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("21 Jan 2019 09:00:43 GMT", datetime(2019, 1, 21, 9, 0, 43, tzinfo=UTC)),
        ("2 Jan 2006 15:04:05 GMT", datetime(2006, 1, 2, 15, 4, 5, tzinfo=UTC)),
        ("Wed, 15 Jan 2025 12:00:00 GMT", datetime(2025, 1, 15, 12, 0, tzinfo=UTC)),
        ("15 JAN 2025 12:00:00 GMT", datetime(2025, 1, 15, 12, 0, tzinfo=UTC)),
    ],
)
def test_gmt_times(text: str, expected: datetime) -> None:
    assert fields.as_gmt_time(text, "t") == expected


@pytest.mark.parametrize(
    "text",
    [
        "2019-01-21T09:00:43Z",
        "21 Jan 2019 09:00:43",
        "21 Jan 2019 09:00:43 UTC",
        "32 Jan 2019 09:00:43 GMT",
        "21 Jan 1969 09:00:43 GMT",
        "21 Jan 2019 25:00:00 GMT",
        "٢١ Jan 2019 09:00:43 GMT",
    ],
)
def test_bad_gmt_times(text: str) -> None:
    with pytest.raises(ParseError, match=r"^t: "):
        fields.as_gmt_time(text, "t")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0001-01-01T00:00:00+01:00", "time out of range"),  # the UTC conversion overflows
        ("1960-01-01T00:00:00Z", "time out of range"),
        ("2025-01-01", "time without a zone"),
        ("2025-13-01T00:00:00Z", "not an RFC 3339 time"),
    ],
)
def test_bad_rfc3339_times(text: str, message: str) -> None:
    with pytest.raises(ParseError, match=f"^t: .*{message}"):
        fields.as_time(text, "t")


def test_nanosecond_times_keep_microseconds() -> None:
    t = fields.as_time("2025-09-16T10:42:31.782066320Z", "t")
    assert t == datetime(2025, 9, 16, 10, 42, 31, 782066, tzinfo=UTC)


@pytest.mark.parametrize("seconds", [float("nan"), float("inf"), 1e20])
def test_plus_out_of_range_is_a_parse_error(seconds: float) -> None:
    with pytest.raises(ParseError, match="deadline out of range"):
        fields.plus(datetime(2025, 1, 1, tzinfo=UTC), seconds)


def test_plus_at_the_end_of_time() -> None:
    with pytest.raises(ParseError, match="deadline out of range"):
        fields.plus(datetime(9999, 12, 31, 23, 59, tzinfo=UTC), 120)


def test_deep_nesting_is_a_parse_error() -> None:
    with pytest.raises(ParseError, match="nested too deeply"):
        fields.load(b"[" * 200_000 + b"]" * 200_000)


def test_lone_surrogates_are_refused() -> None:
    with pytest.raises(ParseError, match="x: not valid Unicode text"):
        fields.as_text("i-\ud800", "x")


@pytest.mark.parametrize("value", ["", "   ", None, 0, [], {}])
def test_blank_or_non_string_text_is_refused(value: object) -> None:
    with pytest.raises(ParseError, match=r"^x: "):
        fields.as_text(value, "x")


def test_messages_show_values_bounded_and_on_one_line() -> None:
    shown = fields.show("a\nb" * 100)
    assert "\n" not in shown and len(shown) <= 40
