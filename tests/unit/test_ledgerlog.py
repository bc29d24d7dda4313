"""The cluster records of pending ledger events: names, labels and the annotation's encoding."""

import json
import re
from datetime import UTC, datetime

import pytest

from reclaimd.cluster.ledgerlog import (
    EVENT_ANNOTATION,
    HOLDER_ANNOTATION,
    HOLDERS_ANNOTATION,
    MAX_EVENT_BYTES,
    PUBLISHED_ANNOTATION,
    TooLarge,
    decode_event,
    encode_event,
    record_name,
    topic_label,
)

AT = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
LABEL_VALUE = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")


def annotations(text: str, holder: str = "a", holders: list[str] | None = None) -> dict[str, str]:
    return {
        EVENT_ANNOTATION: text,
        HOLDER_ANNOTATION: holder,
        HOLDERS_ANNOTATION: json.dumps(holders if holders is not None else [holder]),
    }


def test_record_names_are_object_names_per_topic_and_event() -> None:
    name = record_name("restart-waste", "evt/with:odd chars" * 20)
    assert DNS_LABEL.fullmatch(name) and len(name) <= 63
    assert name == record_name("restart-waste", "evt/with:odd chars" * 20)
    assert record_name("restart-waste", "e1") != record_name("allocation", "e1")
    assert record_name("t", "e1") != record_name("t", "e2")


def test_topic_label_is_a_label_value() -> None:
    label = topic_label("a.topic_name-" * 30)
    assert LABEL_VALUE.fullmatch(label) and len(label) <= 63


def test_event_round_trips_through_the_annotation() -> None:
    headers = (("event_id", b"e1"), ("traceparent", b"\x00\xff"))
    text = encode_event(
        "t", "e1", key=b"acme|gang", value=b'{"EventId":"e1"}', headers=headers, recorded_at=AT
    )
    assert json.loads(text)["value"] == '{"EventId":"e1"}'  # readable with kubectl
    ev = decode_event("n", annotations(text, "b", ["a", "b"]), "42")
    assert (ev.name, ev.topic, ev.event_id, ev.key, ev.value, ev.headers) == (
        "n",
        "t",
        "e1",
        b"acme|gang",
        b'{"EventId":"e1"}',
        headers,
    )
    assert (ev.recorded_at, ev.holder, ev.holders, ev.resource_version) == (
        AT,
        "b",
        ("a", "b"),
        "42",
    )


def test_binary_value_and_no_key_round_trip() -> None:
    text = encode_event("t", "e1", key=None, value=b"\xff\xfe", headers=(), recorded_at=AT)
    ev = decode_event("n", annotations(text))
    assert (ev.key, ev.value, ev.holders) == (None, b"\xff\xfe", ("a",))


def test_an_event_too_large_for_an_annotation_is_refused() -> None:
    with pytest.raises(TooLarge, match="over"):
        encode_event("t", "e1", key=None, value=b"x" * MAX_EVENT_BYTES, headers=(), recorded_at=AT)


@pytest.mark.parametrize(
    "notes",
    [
        {},
        annotations("not json"),
        annotations('{"id": "e1"}'),
        {
            **annotations(encode_event("t", "e", key=None, value=b"v", headers=(), recorded_at=AT)),
            HOLDERS_ANNOTATION: '["a", 1]',  # a holder that is not a name
        },
    ],
)
def test_a_record_that_is_not_ours_is_one_line_value_error(notes: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="ledger record n") as e:
        decode_event("n", notes)
    assert "\n" not in str(e.value)


def test_a_tombstone_decodes_as_a_published_record() -> None:
    stone = json.dumps({"topic": "t", "id": "e1", "at": "2026-03-01T12:00:00Z"})
    ev = decode_event("n", {PUBLISHED_ANNOTATION: stone, HOLDER_ANNOTATION: "a"}, "7")
    assert (ev.event_id, ev.topic, ev.published_at, ev.holder, ev.value) == (
        "e1",
        "t",
        AT,
        "a",
        b"",
    )
    with pytest.raises(ValueError, match="ledger record n"):
        decode_event("n", {PUBLISHED_ANNOTATION: "{}"})


def test_a_live_record_is_not_a_tombstone() -> None:
    text = encode_event("t", "e1", key=None, value=b"v", headers=(), recorded_at=AT)
    assert decode_event("n", annotations(text)).published_at is None
