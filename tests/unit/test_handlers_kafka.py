"""CloudEvents notices from the Kafka notices topic (handlers/kafka_notices/parser.py)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

import pytest

from reclaimd.handlers.kafka_notices import parser as kafka_notice
from reclaimd.model import (
    Ignored,
    Notice,
    NoticeKind,
    ParseError,
    ParseOutcome,
    Response,
    Target,
    Windows,
    WorkloadRef,
    digest,
    frozen_map,
    stable_id,
)

RECEIVED = datetime(2025, 1, 1, 12, 0, 2, tzinfo=UTC)
DEFAULT = Windows()
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def event(kind: str = "spot_interruption", **overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "specversion": "1.0",
        "id": "e-42",
        "source": "//drills/us-east-2",
        "type": f"io.reclaimd.notice.{kind}.v1",
        "time": "2025-01-01T12:00:00Z",
        "datacontenttype": "application/json",
        "data": {
            "target": {"node_name": "ip-10-0-0-1", "instance_id": "i-0abc"},
            "attributes": {"region": "us-east-2"},
        },
    }
    base.update(overrides)
    return base


def with_data(**data: Any) -> dict[str, Any]:
    e = event()
    e["data"] = {**e["data"], **data}
    return e


def parse(payload: bytes | dict[str, Any], windows: Windows = DEFAULT) -> ParseOutcome:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return kafka_notice.parse(body, received_at=RECEIVED, windows=windows)


def one(payload: bytes | dict[str, Any], windows: Windows = DEFAULT) -> Notice:
    out = parse(payload, windows)
    assert isinstance(out, tuple), out
    (notice,) = out
    return notice


def test_spot_interruption_event() -> None:
    e = event(traceparent=TRACEPARENT)
    e["data"]["deadline"] = "2025-01-01T12:01:30Z"
    assert one(e) == Notice(
        id=stable_id("kafka://drills/us-east-2", "e-42"),
        source="kafka://drills/us-east-2",
        kind=NoticeKind.SPOT_INTERRUPTION,
        target=Target(instance_id="i-0abc", node_name="ip-10-0-0-1"),
        issued_at=datetime(2025, 1, 1, 12, 0, tzinfo=UTC),
        deadline=datetime(2025, 1, 1, 12, 1, 30, tzinfo=UTC),
        received_at=RECEIVED,
        response=Response.FULL,
        attributes=frozen_map({"region": "us-east-2", "traceparent": TRACEPARENT}),
        payload_digest=digest(json.dumps(e).encode()),
    )


@pytest.mark.parametrize(
    ("kind", "response"),
    [
        (NoticeKind.SPOT_INTERRUPTION, Response.FULL),
        (NoticeKind.REBALANCE_RECOMMENDATION, Response.CHECKPOINT_ONLY),
        (NoticeKind.PREEMPTION, Response.FULL),
        (NoticeKind.MAINTENANCE, Response.FULL),
        (NoticeKind.RECLAIM, Response.NO_CORDON),
        (NoticeKind.SCHEDULED_CHANGE, Response.FULL),
        (NoticeKind.STATE_CHANGE, Response.FULL),
    ],
)
def test_one_type_per_kind_with_its_default_response(kind: NoticeKind, response: Response) -> None:
    notice = one(event(kind.value))
    assert (notice.kind, notice.response) == (kind, response)


def test_every_kind_has_a_type() -> None:
    assert set(kafka_notice.TYPES.values()) == set(NoticeKind)


def test_default_deadline_is_time_plus_the_default_window() -> None:
    notice = one(event(), Windows(default_s=75))
    assert notice.deadline == datetime(2025, 1, 1, 12, 1, 15, tzinfo=UTC)


def test_rebalance_without_deadline_has_none() -> None:
    assert one(event("rebalance_recommendation")).deadline is None


def test_rebalance_with_a_deadline_keeps_it() -> None:
    e = event("rebalance_recommendation")
    e["data"]["deadline"] = "2025-01-01T13:00:00+01:00"
    assert one(e).deadline == datetime(2025, 1, 1, 12, 0, tzinfo=UTC)


def test_response_can_be_overridden() -> None:
    notice = one(with_data(response="checkpoint_only"))
    assert notice.response is Response.CHECKPOINT_ONLY


def test_workload_target() -> None:
    e = event("reclaim")
    e["data"]["target"] = {"workload": {"namespace": "team-b", "name": "wl", "uid": "u-1"}}
    notice = one(e)
    assert notice.target == Target(workload=WorkloadRef("team-b", "wl", "u-1"))
    assert notice.response is Response.NO_CORDON


def test_event_without_time_is_issued_when_received() -> None:
    e = event()
    del e["time"]
    notice = one(e, Windows(default_s=10))
    assert notice.issued_at == RECEIVED
    assert notice.deadline == datetime(2025, 1, 1, 12, 0, 12, tzinfo=UTC)


@pytest.mark.parametrize(
    "content_type", ["application/json; charset=utf-8", "application/cloudevents+json"]
)
def test_json_content_types(content_type: str) -> None:
    assert one(event(datacontenttype=content_type)).kind is NoticeKind.SPOT_INTERRUPTION


def test_datacontenttype_may_be_absent() -> None:
    e = event()
    del e["datacontenttype"]
    assert one(e).kind is NoticeKind.SPOT_INTERRUPTION


# --- identity ----------------------------------------------------------------------------


def test_retry_of_the_same_event_is_one_notice() -> None:
    first = one(event())
    retry = one(event(time="2025-01-01T12:00:01Z"))
    assert first.id == retry.id


def test_same_id_from_another_source_is_another_notice() -> None:
    assert one(event()).id != one(event(source="//drills/eu-west-1")).id
    assert one(event()).id != one(event(id="e-43")).id


# --- not a notice, malformed -------------------------------------------------------------


@pytest.mark.parametrize(
    "ce_type",
    [
        "io.reclaimd.notice.spot_interruption.v2",
        "com.example.object.created",
        "io.reclaimd.ledger.v1",
    ],
)
def test_unknown_types_are_ignored(ce_type: str) -> None:
    out = parse(event(type=ce_type))
    assert isinstance(out, Ignored)
    assert ce_type in out.reason


def _without(key: str) -> dict[str, Any]:
    e = event()
    del e[key]
    return e


def _data_without(key: str) -> dict[str, Any]:
    e = event()
    del e["data"][key]
    return e


MALFORMED: list[tuple[dict[str, Any], str]] = [
    (event(specversion="0.3"), "specversion: '0.3' is not 1.0"),
    (_without("specversion"), "specversion: missing"),
    (_without("id"), "id: missing"),
    (_without("source"), "source: missing"),
    (_without("type"), "type: missing"),
    (event(id=42), "id: expected a string"),
    (_without("data"), "data: missing"),
    (event(data="i-0abc"), "data: expected an object"),
    (event(data_base64="eyJ9"), "data_base64: binary data is not supported"),
    (event(datacontenttype="text/plain"), "datacontenttype: 'text/plain' is not JSON"),
    (event(time="noon"), "time: not an RFC 3339 time"),
    (_data_without("target"), "data.target: missing"),
    (with_data(target={}), "data.target: names nothing"),
    (with_data(target={"node_name": ""}), "data.target: names nothing"),
    (with_data(target={"node_name": 5}), "data.target.node_name: expected a string"),
    (with_data(target={"workload": {"name": "wl"}}), "data.target.workload.namespace: missing"),
    (with_data(deadline="2025-01-01T12:02:00"), "data.deadline: time without a zone"),
    (with_data(response="drain"), "data.response: 'drain' is not one of full"),
    (with_data(attributes={"gpus": 8}), "data.attributes.gpus: expected a string"),
    (with_data(attributes=["region"]), "data.attributes: expected an object"),
    (event(traceparent=["00-1"]), "traceparent: expected a string"),
]


@pytest.mark.parametrize(("payload", "message"), MALFORMED)
def test_malformed_events_are_parse_errors(payload: dict[str, Any], message: str) -> None:
    with pytest.raises(ParseError, match=re.escape(message)):
        parse(payload)


@pytest.mark.parametrize("payload", [b"", b"{", b"[]", b"42", b"\xfe\xff"])
def test_payloads_that_are_no_event_are_parse_errors(payload: bytes) -> None:
    with pytest.raises(ParseError):
        parse(payload)


def test_checkpoint_only_override_without_deadline_is_an_early_warning() -> None:
    assert one(with_data(response="checkpoint_only")).deadline is None


def test_full_override_of_a_rebalance_gets_the_default_window() -> None:
    e = event("rebalance_recommendation")
    e["data"]["response"] = "full"
    assert one(e, Windows(default_s=60)).deadline == datetime(2025, 1, 1, 12, 1, tzinfo=UTC)
