"""EventBridge/SQS EC2 notices and ASG lifecycle hooks (handlers/sqs/parser.py)."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from shared_fixtures import FIXTURES as SHARED

from reclaimd.handlers.sqs import parser as ec2_spot
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
RECEIVED = datetime(2025, 1, 1, 12, 0, 5, tzinfo=UTC)
INSTANCE = "i-1234567890abcdef0"
DEFAULT = Windows()


def raw(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def doc(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(raw(name))
    return data


def parse(payload: bytes | dict[str, Any], windows: Windows = DEFAULT) -> ParseOutcome:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return ec2_spot.parse(body, received_at=RECEIVED, windows=windows)


def notices(payload: bytes | dict[str, Any], windows: Windows = DEFAULT) -> tuple[Notice, ...]:
    out = parse(payload, windows)
    assert isinstance(out, tuple), out
    return out


def one(payload: bytes | dict[str, Any], windows: Windows = DEFAULT) -> Notice:
    (notice,) = notices(payload, windows)
    return notice


# --- every fixture, field by field -------------------------------------------------------


def test_spot_interruption_warning() -> None:
    payload = raw("eventbridge-spot-interruption-warning.json")
    assert one(payload) == Notice(
        id=stable_id("aws.ec2.spot", "12345678-1234-1234-1234-123456789012", INSTANCE),
        source="aws.ec2.spot",
        kind=NoticeKind.SPOT_INTERRUPTION,
        target=Target(instance_id=INSTANCE, provider_id=f"aws:///us-east-2a/{INSTANCE}"),
        issued_at=datetime(2025, 1, 1, 12, 0, tzinfo=UTC),
        deadline=datetime(2025, 1, 1, 12, 2, tzinfo=UTC),
        received_at=RECEIVED,
        response=Response.FULL,
        attributes=frozen_map(
            {
                "region": "us-east-2",
                "zone": "us-east-2a",
                "account": "123456789012",
                "instance_action": "terminate",
            }
        ),
        payload_digest=digest(payload),
    )


def test_rebalance_recommendation_is_checkpoint_only_without_deadline() -> None:
    payload = raw("eventbridge-rebalance-recommendation.json")
    assert one(payload) == Notice(
        id=stable_id("aws.ec2.rebalance", "5d5555d5-dd55-5555-5555-5555dd55d55d", INSTANCE),
        source="aws.ec2.rebalance",
        kind=NoticeKind.REBALANCE_RECOMMENDATION,
        target=Target(instance_id=INSTANCE, provider_id=f"aws:///us-east-2a/{INSTANCE}"),
        issued_at=datetime(2025, 1, 1, 11, 50, tzinfo=UTC),
        deadline=None,
        received_at=RECEIVED,
        response=Response.CHECKPOINT_ONLY,
        attributes=frozen_map(
            {"region": "us-east-2", "zone": "us-east-2a", "account": "123456789012"}
        ),
        payload_digest=digest(payload),
    )


def test_state_change_shutting_down() -> None:
    payload = raw("eventbridge-instance-state-change.json")
    # The state-change ARN carries the region, not the AZ: no providerID can be built.
    assert one(payload) == Notice(
        id=stable_id("aws.ec2.state", "7bf73129-1428-4cd3-a780-95db273d1602", INSTANCE),
        source="aws.ec2.state",
        kind=NoticeKind.STATE_CHANGE,
        target=Target(instance_id=INSTANCE),
        issued_at=datetime(2025, 1, 1, 12, 2, tzinfo=UTC),
        deadline=datetime(2025, 1, 1, 12, 4, tzinfo=UTC),
        received_at=RECEIVED,
        attributes=frozen_map(
            {"region": "us-east-2", "account": "123456789012", "state": "shutting-down"}
        ),
        payload_digest=digest(payload),
    )


def test_health_scheduled_change_ends_at_start_time() -> None:
    payload = raw("eventbridge-health-scheduled-change.json")
    arn = (
        "arn:aws:health:us-east-2::event/EC2/AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED/"
        "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED_ABC123-DEF456"
    )
    assert one(payload) == Notice(
        id=stable_id("aws.health", arn, INSTANCE, "Wed, 15 Jan 2025 12:00:00 GMT"),
        source="aws.health",
        kind=NoticeKind.SCHEDULED_CHANGE,
        target=Target(instance_id=INSTANCE),
        issued_at=datetime(2025, 1, 1, 12, 0, tzinfo=UTC),
        deadline=datetime(2025, 1, 15, 12, 0, tzinfo=UTC),
        received_at=RECEIVED,
        attributes=frozen_map(
            {
                "region": "us-east-2",
                "account": "123456789012",
                "event_type_code": "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED",
                "status_code": "upcoming",
                "health_event_arn": arn,
            }
        ),
        payload_digest=digest(payload),
    )


def test_asg_lifecycle_via_eventbridge_keeps_what_completes_the_action() -> None:
    payload = raw("eventbridge-asg-terminate-lifecycle-action.json")
    token = "87654321-4321-4321-4321-210987654321"
    assert one(payload) == Notice(
        id=stable_id("aws.autoscaling", token, INSTANCE),
        source="aws.autoscaling",
        kind=NoticeKind.SCHEDULED_CHANGE,
        target=Target(instance_id=INSTANCE),
        issued_at=datetime(2025, 1, 1, 12, 0, tzinfo=UTC),
        deadline=datetime(2025, 1, 1, 12, 2, tzinfo=UTC),
        received_at=RECEIVED,
        attributes=frozen_map(
            {
                "region": "us-west-2",
                "account": "123456789012",
                "asg_name": "my-asg",
                "lifecycle_hook_name": "my-lifecycle-hook",
                "lifecycle_action_token": token,
                "lifecycle_transition": "autoscaling:EC2_INSTANCE_TERMINATING",
                "destination": "EC2",
            }
        ),
        payload_digest=digest(payload),
    )


def test_asg_lifecycle_sent_straight_to_sqs() -> None:
    payload = raw("asg-terminate-lifecycle-direct-sqs.json")
    token = "b4dd0f5b-0ef2-4479-9dad-6c55f027000e"
    assert one(payload) == Notice(
        id=stable_id("aws.autoscaling", token, INSTANCE),
        source="aws.autoscaling",
        kind=NoticeKind.SCHEDULED_CHANGE,
        target=Target(instance_id=INSTANCE),
        issued_at=datetime(2025, 1, 1, 12, 0, tzinfo=UTC),
        deadline=datetime(2025, 1, 1, 12, 2, tzinfo=UTC),
        received_at=RECEIVED,
        attributes=frozen_map(
            {
                "account": "123456789012",
                "asg_name": "my-asg",
                "lifecycle_hook_name": "my-lifecycle-hook",
                "lifecycle_action_token": token,
                "lifecycle_transition": "autoscaling:EC2_INSTANCE_TERMINATING",
                "destination": "EC2",
            }
        ),
        payload_digest=digest(payload),
    )


def test_asg_test_notification_is_ignored() -> None:
    out = parse(raw("asg-test-notification-direct-sqs.json"))
    assert out == Ignored("Auto Scaling test notification")


# --- identity ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "eventbridge-spot-interruption-warning.json",
        "eventbridge-rebalance-recommendation.json",
        "eventbridge-instance-state-change.json",
        "eventbridge-health-scheduled-change.json",
        "eventbridge-asg-terminate-lifecycle-action.json",
        "asg-terminate-lifecycle-direct-sqs.json",
    ],
)
def test_redelivery_maps_to_the_same_notice(name: str) -> None:
    first = one(raw(name))
    later = ec2_spot.parse(
        raw(name), received_at=datetime(2025, 1, 1, 12, 0, 30, tzinfo=UTC), windows=Windows()
    )
    assert isinstance(later, tuple)
    assert later[0].id == first.id
    assert later[0].received_at != first.received_at


def test_another_event_id_is_another_notice() -> None:
    event = doc("eventbridge-spot-interruption-warning.json")
    again = copy.deepcopy(event)
    again["id"] = "22222222-1234-1234-1234-123456789012"
    assert one(event).id != one(again).id


def test_same_lifecycle_action_on_both_paths_is_one_notice() -> None:
    bridge = doc("eventbridge-asg-terminate-lifecycle-action.json")
    direct = doc("asg-terminate-lifecycle-direct-sqs.json")
    direct["LifecycleActionToken"] = bridge["detail"]["LifecycleActionToken"]
    assert one(bridge).id == one(direct).id


def test_health_update_keeps_the_id_and_reschedule_changes_it() -> None:
    event = doc("eventbridge-health-scheduled-change.json")
    update = copy.deepcopy(event)
    update["id"] = "0fb65329-1628-4cf3-a740-95fd457b1402"
    update["detail"]["statusCode"] = "open"
    moved = copy.deepcopy(event)
    moved["detail"]["startTime"] = "Thu, 16 Jan 2025 12:00:00 GMT"
    assert one(update).id == one(event).id
    assert one(moved).id != one(event).id
    assert one(moved).deadline == datetime(2025, 1, 16, 12, 0, tzinfo=UTC)


# --- deadlines ---------------------------------------------------------------------------


def test_spot_deadline_follows_the_window() -> None:
    windows = Windows(ec2_spot_s=90.5)
    notice = one(raw("eventbridge-spot-interruption-warning.json"), windows)
    assert notice.deadline == datetime(2025, 1, 1, 12, 1, 30, 500000, tzinfo=UTC)


def test_state_change_and_asg_use_the_scheduled_window() -> None:
    windows = Windows(ec2_spot_s=1.0, ec2_scheduled_s=45.0)
    state = one(raw("eventbridge-instance-state-change.json"), windows)
    asg = one(raw("asg-terminate-lifecycle-direct-sqs.json"), windows)
    assert state.deadline == datetime(2025, 1, 1, 12, 2, 45, tzinfo=UTC)
    assert asg.deadline == datetime(2025, 1, 1, 12, 0, 45, tzinfo=UTC)


def test_health_accepts_an_rfc3339_start_time() -> None:
    event = doc("eventbridge-health-scheduled-change.json")
    event["detail"]["startTime"] = "2025-01-15T13:00:00+01:00"
    assert one(event).deadline == datetime(2025, 1, 15, 12, 0, tzinfo=UTC)


# --- what is a notice and what is not ----------------------------------------------------


@pytest.mark.parametrize("action", ["terminate", "stop", "hibernate"])
def test_spot_action_is_kept(action: str) -> None:
    event = doc("eventbridge-spot-interruption-warning.json")
    event["detail"]["instance-action"] = action
    assert one(event).attributes["instance_action"] == action


@pytest.mark.parametrize("state", ["shutting-down", "stopping", "stopped", "terminated"])
def test_departing_states_are_notices(state: str) -> None:
    event = doc("eventbridge-instance-state-change.json")
    event["detail"]["state"] = state
    notice = one(event)
    assert notice.kind is NoticeKind.STATE_CHANGE
    assert notice.attributes["state"] == state


@pytest.mark.parametrize("state", ["pending", "running"])
def test_arriving_states_are_ignored(state: str) -> None:
    event = doc("eventbridge-instance-state-change.json")
    event["detail"]["state"] = state
    assert parse(event) == Ignored(f"instance {INSTANCE} is {state}, not leaving")


def test_health_lists_one_notice_per_instance_and_skips_other_entities() -> None:
    event = doc("eventbridge-health-scheduled-change.json")
    event["detail"]["affectedEntities"] = [
        {"entityValue": "i-0aaaaaaaaaaaaaaa1"},
        {"entityValue": "vol-0123456789abcdef0"},
        {"entityValue": "i-0aaaaaaaaaaaaaaa2", "tags": {}},
        {"entityValue": "i-0aaaaaaaaaaaaaaa1"},
    ]
    out = notices(event)
    assert [n.target.instance_id for n in out] == ["i-0aaaaaaaaaaaaaaa1", "i-0aaaaaaaaaaaaaaa2"]
    assert len({n.id for n in out}) == 2


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("service", "EBS"),
        ("eventTypeCategory", "issue"),
        ("eventTypeCategory", "accountNotification"),
    ],
)
def test_health_events_other_than_ec2_scheduled_changes_are_ignored(key: str, value: str) -> None:
    event = doc("eventbridge-health-scheduled-change.json")
    event["detail"][key] = value
    out = parse(event)
    assert isinstance(out, Ignored)
    assert "not an EC2 scheduled change" in out.reason


def test_health_without_an_instance_is_ignored() -> None:
    event = doc("eventbridge-health-scheduled-change.json")
    event["detail"]["affectedEntities"] = [{"entityValue": "vol-0123456789abcdef0"}]
    assert parse(event) == Ignored("AWS Health scheduled change names no EC2 instance")


def test_launch_lifecycle_is_ignored() -> None:
    direct = doc("asg-terminate-lifecycle-direct-sqs.json")
    direct["LifecycleTransition"] = "autoscaling:EC2_INSTANCE_LAUNCHING"
    out = parse(direct)
    assert out == Ignored(
        "lifecycle transition autoscaling:EC2_INSTANCE_LAUNCHING is not a termination"
    )


@pytest.mark.parametrize(
    ("source", "detail_type"),
    [
        ("aws.autoscaling", "EC2 Instance-launch Lifecycle Action"),
        ("aws.ec2", "EC2 Capacity Reservation Instance Interruption Warning"),
        ("aws.ec2", "EC2 Instance Rebalance Recommendation (v2)"),
        ("aws.health", "EC2 Spot Instance Interruption Warning"),
    ],
)
def test_unknown_eventbridge_kinds_are_ignored(source: str, detail_type: str) -> None:
    event = doc("eventbridge-spot-interruption-warning.json")
    event["source"], event["detail-type"] = source, detail_type
    out = parse(event)
    assert isinstance(out, Ignored)
    assert source in out.reason and "not handled" in out.reason


def test_sns_wrapped_message_is_unwrapped() -> None:
    inner = raw("eventbridge-spot-interruption-warning.json").decode()
    wrapped = {"Type": "Notification", "MessageId": "m-1", "Message": inner}
    notice = one(wrapped)
    assert notice.source == "aws.ec2.spot"
    assert notice.id == one(raw("eventbridge-spot-interruption-warning.json")).id


# --- malformed ---------------------------------------------------------------------------

Mutation = Callable[[dict[str, Any]], None]


def _set(path: str, value: Any) -> Mutation:
    def apply(event: dict[str, Any]) -> None:
        *parents, last = path.split("/")
        node = event
        for key in parents:
            node = node[key]
        node[last] = value

    return apply


def _drop(path: str) -> Mutation:
    def apply(event: dict[str, Any]) -> None:
        *parents, last = path.split("/")
        node = event
        for key in parents:
            node = node[key]
        del node[last]

    return apply


MALFORMED: list[tuple[str, Mutation, str]] = [
    ("eventbridge-spot-interruption-warning.json", _drop("detail"), "detail: missing"),
    (
        "eventbridge-spot-interruption-warning.json",
        _set("detail", []),
        "detail: expected an object",
    ),
    (
        "eventbridge-spot-interruption-warning.json",
        _drop("detail/instance-id"),
        "detail.instance-id: missing",
    ),
    (
        "eventbridge-spot-interruption-warning.json",
        _set("detail/instance-id", 7),
        "detail.instance-id: expected a string",
    ),
    (
        "eventbridge-spot-interruption-warning.json",
        _set("detail/instance-action", ""),
        "detail.instance-action: empty",
    ),
    ("eventbridge-spot-interruption-warning.json", _drop("id"), "id: missing"),
    ("eventbridge-spot-interruption-warning.json", _drop("time"), "time: missing"),
    (
        "eventbridge-spot-interruption-warning.json",
        _set("time", "yesterday"),
        "time: not an RFC 3339 time",
    ),
    (
        "eventbridge-spot-interruption-warning.json",
        _set("time", "2025-01-01T12:00:00"),
        "time: time without a zone",
    ),
    (
        "eventbridge-spot-interruption-warning.json",
        _set("time", "1969-12-31T23:59:59Z"),
        "time: time out of range",
    ),
    (
        "eventbridge-spot-interruption-warning.json",
        _set("time", "9999-12-31T23:59:59Z"),
        "time: issued in the future",
    ),
    (
        "eventbridge-spot-interruption-warning.json",
        _set("resources", "arn:aws:ec2:us-east-2a:instance/i-1"),
        "resources: expected a list",
    ),
    (
        "eventbridge-spot-interruption-warning.json",
        _set("resources", [None]),
        "resources[0]: expected a string",
    ),
    ("eventbridge-spot-interruption-warning.json", _set("source", None), "source: missing"),
    ("eventbridge-instance-state-change.json", _drop("detail/state"), "detail.state: missing"),
    (
        "eventbridge-health-scheduled-change.json",
        _set("detail/startTime", "15 Jan 2025"),
        "detail.startTime: not an RFC 3339 time",
    ),
    (
        "eventbridge-health-scheduled-change.json",
        _set("detail/startTime", "Wed, 31 Feb 2025 12:00:00 GMT"),
        "detail.startTime: no such time",
    ),
    (
        "eventbridge-health-scheduled-change.json",
        _set("detail/startTime", "Wed, 15 Foo 2025 12:00:00 GMT"),
        "detail.startTime: not a 'DD Mon YYYY hh:mm:ss GMT' time",
    ),
    (
        "eventbridge-health-scheduled-change.json",
        _set("detail/affectedEntities", {}),
        "detail.affectedEntities: expected a list",
    ),
    (
        "eventbridge-health-scheduled-change.json",
        _set("detail/affectedEntities", [{"tags": {}}]),
        "entityValue: missing",
    ),
    (
        "eventbridge-asg-terminate-lifecycle-action.json",
        _drop("detail/LifecycleActionToken"),
        "detail.LifecycleActionToken: missing",
    ),
    (
        "eventbridge-asg-terminate-lifecycle-action.json",
        _drop("detail/AutoScalingGroupName"),
        "detail.AutoScalingGroupName: missing",
    ),
    ("asg-terminate-lifecycle-direct-sqs.json", _drop("Time"), "Time: missing"),
    ("asg-terminate-lifecycle-direct-sqs.json", _drop("EC2InstanceId"), "EC2InstanceId: missing"),
    (
        "asg-terminate-lifecycle-direct-sqs.json",
        _drop("LifecycleTransition"),
        "neither an EventBridge event nor an Auto Scaling lifecycle message",
    ),
]


@pytest.mark.parametrize(("name", "mutate", "message"), MALFORMED)
def test_malformed_events_are_parse_errors(name: str, mutate: Mutation, message: str) -> None:
    event = doc(name)
    mutate(event)
    with pytest.raises(ParseError, match=re.escape(message)):
        parse(event)


@pytest.mark.parametrize(
    "payload",
    [b"", b"not json", b"[]", b'"text"', b"null", b"\xff\xfe\x00", b'{"Type": "Notification"}'],
)
def test_payloads_that_are_not_an_event_are_parse_errors(payload: bytes) -> None:
    with pytest.raises(ParseError):
        parse(payload)


def test_sns_message_that_is_not_json_is_a_parse_error() -> None:
    with pytest.raises(ParseError, match="not JSON"):
        parse({"Type": "Notification", "Message": "{oops"})


# --- zone, from the ARN ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arn", "zone"),
    [
        (f"arn:aws:ec2:us-east-2a:instance/{INSTANCE}", "us-east-2a"),
        (f"arn:aws:ec2:us-east-2-wl1-cmh-wlz-1:instance/{INSTANCE}", "us-east-2-wl1-cmh-wlz-1"),
        (f"arn:aws:ec2:us-east-2:123456789012:instance/{INSTANCE}", ""),
        ("arn:aws:ec2:us-east-2a:instance/i-0fffffffffffffff0", ""),
        (f"arn:aws:ec2:eu-west-1a:instance/{INSTANCE}", ""),
        ("not an arn", ""),
    ],
)
def test_zone_comes_from_an_arn_naming_this_instance(arn: str, zone: str) -> None:
    event = doc("eventbridge-spot-interruption-warning.json")
    event["resources"] = [arn]
    notice = one(event)
    assert notice.attributes.get("zone", "") == zone
    assert notice.target.provider_id == (f"aws:///{zone}/{INSTANCE}" if zone else "")
