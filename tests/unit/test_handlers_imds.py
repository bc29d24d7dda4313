"""IMDS notices in the per-node poller's envelope (handlers/imds/parser.py)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

import pytest
from shared_fixtures import FIXTURES as SHARED

from reclaimd.handlers.imds import parser as imds
from reclaimd.model import (
    Ignored,
    Notice,
    NoticeKind,
    ParseError,
    ParseOutcome,
    Response,
    Target,
    Windows,
    digest,
    frozen_map,
    stable_id,
)

FIXTURES = SHARED / "aws"
RECEIVED = datetime(2025, 1, 1, 12, 0, 3, tzinfo=UTC)
INSTANCE = "i-1234567890abcdef0"
DEFAULT = Windows()


def body(name: str) -> str:
    return (FIXTURES / name).read_text()


def envelope(path: str, response: Any, **extra: Any) -> dict[str, Any]:
    return {"instance_id": INSTANCE, "path": path, "body": response, **extra}


def parse(
    payload: dict[str, Any], *, received_at: datetime = RECEIVED, windows: Windows = DEFAULT
) -> ParseOutcome:
    return imds.parse(json.dumps(payload).encode(), received_at=received_at, windows=windows)


def notices(payload: dict[str, Any], **kw: Any) -> tuple[Notice, ...]:
    out = parse(payload, **kw)
    assert isinstance(out, tuple), out
    return out


def one(payload: dict[str, Any], **kw: Any) -> Notice:
    (notice,) = notices(payload, **kw)
    return notice


SPOT = "spot/instance-action"
REBALANCE = "events/recommendations/rebalance"
SCHEDULED = "events/maintenance/scheduled"
LIFECYCLE = "autoscaling/target-lifecycle-state"


# --- every fixture, field by field -------------------------------------------------------


def test_spot_instance_action() -> None:
    env = envelope(
        SPOT,
        body("imds-spot-instance-action.json"),
        zone="us-east-2a",
        region="us-east-2",
        node_name="ip-10-0-0-1.us-east-2.compute.internal",
        instance_type="p5.48xlarge",
    )
    assert one(env) == Notice(
        id=stable_id("aws.imds.spot", INSTANCE, "terminate", "2025-01-01T12:02:00Z"),
        source="aws.imds.spot",
        kind=NoticeKind.SPOT_INTERRUPTION,
        target=Target(
            instance_id=INSTANCE,
            provider_id=f"aws:///us-east-2a/{INSTANCE}",
            node_name="ip-10-0-0-1.us-east-2.compute.internal",
        ),
        # IMDS gives the time of the action: that is the deadline, the warning came a
        # Spot window earlier.
        issued_at=datetime(2025, 1, 1, 12, 0, tzinfo=UTC),
        deadline=datetime(2025, 1, 1, 12, 2, tzinfo=UTC),
        received_at=RECEIVED,
        response=Response.FULL,
        attributes=frozen_map(
            {
                "region": "us-east-2",
                "zone": "us-east-2a",
                "instance_type": "p5.48xlarge",
                "instance_action": "terminate",
            }
        ),
        payload_digest=digest(json.dumps(env).encode()),
    )


def test_rebalance_recommendation() -> None:
    env = envelope(REBALANCE, body("imds-rebalance-recommendation.json"))
    assert one(env) == Notice(
        id=stable_id("aws.imds.rebalance", INSTANCE, "2025-01-01T11:50:00Z"),
        source="aws.imds.rebalance",
        kind=NoticeKind.REBALANCE_RECOMMENDATION,
        target=Target(instance_id=INSTANCE),
        issued_at=datetime(2025, 1, 1, 11, 50, tzinfo=UTC),
        deadline=None,
        received_at=RECEIVED,
        response=Response.CHECKPOINT_ONLY,
        payload_digest=digest(json.dumps(env).encode()),
    )


def test_scheduled_maintenance_event() -> None:
    env = envelope(SCHEDULED, body("imds-scheduled-events.json"), zone="us-east-2b")
    assert one(env) == Notice(
        id=stable_id(
            "aws.imds.scheduled",
            INSTANCE,
            "instance-event-0d59937288b749b32",
            "2019-01-21T09:00:43Z",
        ),
        source="aws.imds.scheduled",
        kind=NoticeKind.SCHEDULED_CHANGE,
        target=Target(instance_id=INSTANCE, provider_id=f"aws:///us-east-2b/{INSTANCE}"),
        issued_at=RECEIVED,
        deadline=datetime(2019, 1, 21, 9, 0, 43, tzinfo=UTC),
        received_at=RECEIVED,
        attributes=frozen_map(
            {
                "zone": "us-east-2b",
                "code": "system-reboot",
                "event_id": "instance-event-0d59937288b749b32",
                "not_after": "21 Jan 2019 09:17:23 GMT",
            }
        ),
        payload_digest=digest(json.dumps(env).encode()),
    )


def test_target_lifecycle_state_terminated() -> None:
    notice = one(envelope(LIFECYCLE, "Terminated\n"), windows=Windows(ec2_scheduled_s=60))
    assert notice.source == "aws.imds.asg"
    assert notice.kind is NoticeKind.SCHEDULED_CHANGE
    assert notice.issued_at == RECEIVED
    assert notice.deadline == datetime(2025, 1, 1, 12, 1, 3, tzinfo=UTC)
    assert notice.attributes["target_lifecycle_state"] == "Terminated"


@pytest.mark.parametrize("state", ["InService", "Standby", "Warmed:Stopped", "Detached"])
def test_other_lifecycle_states_are_ignored(state: str) -> None:
    out = parse(envelope(LIFECYCLE, state))
    assert isinstance(out, Ignored)
    assert "is not Terminated" in out.reason


# --- identity: content, not the poll -----------------------------------------------------


@pytest.mark.parametrize(
    ("path", "name"),
    [
        (SPOT, "imds-spot-instance-action.json"),
        (REBALANCE, "imds-rebalance-recommendation.json"),
        (SCHEDULED, "imds-scheduled-events.json"),
    ],
)
def test_repeat_polls_map_to_one_notice(path: str, name: str) -> None:
    first = one(envelope(path, body(name)))
    later = one(envelope(path, body(name)), received_at=datetime(2025, 1, 1, 12, 0, 5, tzinfo=UTC))
    assert first.id == later.id


def test_decoded_body_is_the_same_notice_as_the_text() -> None:
    text = body("imds-spot-instance-action.json")
    assert one(envelope(SPOT, text)).id == one(envelope(SPOT, json.loads(text))).id


def test_another_action_time_or_instance_is_another_notice() -> None:
    base = one(envelope(SPOT, {"action": "terminate", "time": "2025-01-01T12:02:00Z"}))
    later = one(envelope(SPOT, {"action": "terminate", "time": "2025-01-01T13:02:00Z"}))
    other = one(
        {
            **envelope(SPOT, {"action": "terminate", "time": "2025-01-01T12:02:00Z"}),
            "instance_id": "i-0fffffffffffffff0",
        }
    )
    assert len({base.id, later.id, other.id}) == 3


def test_spot_action_time_is_the_deadline_whatever_the_window() -> None:
    notice = one(
        envelope(SPOT, {"action": "stop", "time": "2025-01-01T12:02:00Z"}),
        windows=Windows(ec2_spot_s=30),
    )
    assert notice.deadline == datetime(2025, 1, 1, 12, 2, tzinfo=UTC)
    assert notice.issued_at == datetime(2025, 1, 1, 12, 1, 30, tzinfo=UTC)
    assert notice.attributes["instance_action"] == "stop"


# --- scheduled events --------------------------------------------------------------------


def _event(
    event_id: str, state: str, not_before: str = "21 Jan 2019 09:00:43 GMT"
) -> dict[str, str]:
    return {
        "NotBefore": not_before,
        "Code": "instance-stop",
        "Description": "scheduled stop",
        "EventId": event_id,
        "State": state,
    }


def test_only_active_scheduled_events_are_notices() -> None:
    events = [_event("e-1", "completed"), _event("e-2", "active"), _event("e-3", "canceled")]
    (notice,) = notices(envelope(SCHEDULED, json.dumps(events)))
    assert notice.attributes["event_id"] == "e-2"
    assert "not_after" not in notice.attributes


def test_two_active_scheduled_events_are_two_notices() -> None:
    events = [_event("e-1", "active"), _event("e-2", "active", "22 Jan 2019 10:00:00 GMT")]
    out = notices(envelope(SCHEDULED, events))
    assert [n.deadline for n in out] == [
        datetime(2019, 1, 21, 9, 0, 43, tzinfo=UTC),
        datetime(2019, 1, 22, 10, 0, tzinfo=UTC),
    ]
    assert out[0].id != out[1].id


@pytest.mark.parametrize("events", [[], [_event("e-1", "completed"), _event("e-2", "canceled")]])
def test_no_active_scheduled_event_is_ignored(events: list[dict[str, str]]) -> None:
    assert parse(envelope(SCHEDULED, events)) == Ignored("no active scheduled event")


def test_rescheduled_event_is_a_new_notice() -> None:
    first = one(envelope(SCHEDULED, [_event("e-1", "active")]))
    moved = one(envelope(SCHEDULED, [_event("e-1", "active", "28 Jan 2019 09:00:43 GMT")]))
    assert first.id != moved.id


# --- envelope ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", [f"/latest/meta-data/{SPOT}", f"latest/meta-data/{SPOT}", f"/{SPOT}", SPOT]
)
def test_path_forms(path: str) -> None:
    assert one(envelope(path, body("imds-spot-instance-action.json"))).source == "aws.imds.spot"


MALFORMED: list[tuple[dict[str, Any], str]] = [
    ({"path": SPOT, "body": "{}"}, "instance_id: missing"),
    ({"instance_id": INSTANCE, "body": "{}"}, "path: missing"),
    ({"instance_id": INSTANCE, "path": SPOT}, "body: missing"),
    (envelope("meta-data/instance-id", "i-1"), "path: not an IMDS notice path"),
    (envelope(SPOT, "<html>404</html>"), "not JSON"),
    (envelope(SPOT, '{"action": "terminate"}'), "body.time: missing"),
    (envelope(SPOT, '{"time": "2025-01-01T12:02:00Z"}'), "body.action: missing"),
    (envelope(SPOT, {"action": "terminate", "time": "soon"}), "body.time: not an RFC 3339"),
    (envelope(SPOT, "[]"), "body: expected an object"),
    (envelope(REBALANCE, {"noticeTime": 1735732200}), "body.noticeTime: expected a string"),
    (envelope(SCHEDULED, {"EventId": "e-1"}), "body: expected a list"),
    (
        envelope(SCHEDULED, [_event("e-1", "active", "2019-01-21T09:00:43Z")]),
        "body[0].NotBefore",
    ),
    (envelope(SCHEDULED, [_event("e-1", "active", "30 Feb 2019 09:00:43 GMT")]), "no such time"),
    (
        envelope(SCHEDULED, [{**_event("e-1", "active"), "NotAfter": "later"}]),
        "body[0].NotAfter",
    ),
    (envelope(SCHEDULED, [{"State": "active"}]), "body[0].EventId: missing"),
    (envelope(SCHEDULED, ["e-1"]), "body[0]: expected an object"),
    (envelope(LIFECYCLE, ["Terminated"]), "body: expected a string"),
    (envelope(SPOT, "{}", zone="us-east-2/a"), "zone: not an AWS availability zone"),
    (envelope(SPOT, "{}", node_name=5), "node_name: expected a string"),
]


@pytest.mark.parametrize(("payload", "message"), MALFORMED)
def test_malformed_envelopes_are_parse_errors(payload: dict[str, Any], message: str) -> None:
    with pytest.raises(ParseError, match=re.escape(message)):
        parse(payload)


@pytest.mark.parametrize("payload", [b"", b"{", b"[]", b'"spot"', b"\x00\x01"])
def test_payloads_that_are_no_envelope_are_parse_errors(payload: bytes) -> None:
    with pytest.raises(ParseError):
        imds.parse(payload, received_at=RECEIVED, windows=DEFAULT)


def test_wavelength_zone_is_taken_as_reported() -> None:
    env = envelope(SPOT, body("imds-spot-instance-action.json"), zone="us-east-1-wl1-bos-wlz-1")
    assert one(env).target.provider_id == f"aws:///us-east-1-wl1-bos-wlz-1/{INSTANCE}"
