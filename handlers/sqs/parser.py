"""EC2 interruption notices as EventBridge delivers them to SQS, and Auto Scaling lifecycle hooks.

Design: the SQS body is decoded once (unwrapping an SNS envelope if the queue is fed through
SNS). An EventBridge event is dispatched on ``(source, detail-type)`` to one small function
per kind; a body without ``detail-type`` is an Auto Scaling lifecycle notification sent
straight to SQS. A kind not in the table is ``Ignored``, not an error: EventBridge rules are
often broader than what a consumer handles (every ``AWS Health Event``, launch hooks), and
such a message must be acked, not redelivered.

Identity: ``Notice.id`` hashes the EventBridge ``id`` with the instance (a redelivered SQS
message carries the same event id), except where the source names the underlying change
better: Health uses the Health event ARN, lifecycle hooks the lifecycle action token (see
``_health`` and ``_lifecycle``).

Deadlines: a Spot warning's ``time`` is when it was sent; the instance goes
``windows.ec2_spot_s`` later. State changes and ASG terminations have no deadline of their
own and are treated like a Spot warning (``windows.ec2_scheduled_s``). A Health scheduled
change ends at its ``startTime``. A rebalance recommendation is an early warning with no
deadline: checkpoint, take nothing away.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType

from reclaimd.handlers import ids
from reclaimd.handlers.fields import (
    JSONObject,
    as_gmt_time,
    as_object,
    as_text,
    as_time,
    attributes,
    ident,
    issued,
    items,
    load,
    opt_ident,
    opt_items,
    opt_text,
    plus,
    show,
    sub,
    text,
    time,
)
from reclaimd.handlers.targets import aws_instance, is_aws_zone
from reclaimd.model import (
    Facts,
    Ignored,
    Notice,
    NoticeKind,
    ParseError,
    ParseOutcome,
    Placement,
    Response,
    Windows,
    digest,
    stable_id,
)

# Its windows (``Windows.of``): EC2's two minutes; state changes and ASG terminations have
# none of their own and are acted on as a Spot warning.
WINDOWS: Mapping[str, float] = {"ec2_spot_s": 120.0, "ec2_scheduled_s": 120.0}

_DEPARTING_STATES = frozenset({"shutting-down", "stopping", "stopped", "terminated"})
_TERMINATING = "autoscaling:EC2_INSTANCE_TERMINATING"
_TEST_NOTIFICATION = "autoscaling:TEST_NOTIFICATION"


@dataclass(frozen=True)
class AsgLifecycleFacts(Facts):
    """An Auto Scaling termination lifecycle action a notice came from (EventBridge or
    straight to SQS): what completing it after the drain takes. This source's own facts (its
    registry entry's ``facts``)."""

    asg_name: str = ""
    lifecycle_hook_name: str = ""
    lifecycle_action_token: str = ""
    lifecycle_transition: str = ""


@dataclass(frozen=True)
class _Event:
    """The EventBridge envelope, read once, plus what every kind's notice needs."""

    id: str
    time: datetime
    region: str
    account: str
    resources: tuple[str, ...]
    detail: JSONObject
    received_at: datetime
    windows: Windows
    digest: str

    def zone_of(self, instance_id: str) -> str:
        """The AZ when an ARN in ``resources`` names it (Spot and rebalance events do:
        ``arn:aws:ec2:us-east-2a:instance/i-...``); ``""`` when only the region is known."""
        for arn in self.resources:
            parts = arn.split(":", 5)
            named = len(parts) >= 5 and parts[-1] == f"instance/{instance_id}"
            if named and is_aws_zone(parts[3], self.region):
                return parts[3]
        return ""

    def notice(
        self,
        source: str,
        kind: NoticeKind,
        instance_id: str,
        *,
        deadline: datetime | None,
        response: Response = Response.FULL,
        notice_id: str = "",
        extra: Mapping[str, str] | None = None,
    ) -> Notice:
        zone = self.zone_of(instance_id)
        return Notice(
            id=notice_id or stable_id(source, self.id, instance_id),
            source=source,
            kind=kind,
            target=aws_instance(instance_id, zone=zone),
            issued_at=self.time,
            deadline=deadline,
            received_at=self.received_at,
            response=response,
            attributes=attributes(
                {"region": self.region, "zone": zone, "account": self.account, **(extra or {})}
            ),
            payload_digest=self.digest,
        )


def _spot(ev: _Event) -> ParseOutcome:
    instance = ident(ev.detail, "instance-id", ids.EC2_INSTANCE_ID, at="detail")
    action = text(ev.detail, "instance-action", at="detail")  # terminate | stop | hibernate
    deadline = plus(ev.time, ev.windows.of("ec2_spot_s", WINDOWS))
    notice = ev.notice(
        "aws.ec2.spot",
        NoticeKind.SPOT_INTERRUPTION,
        instance,
        deadline=deadline,
        extra={"instance_action": action},
    )
    return (notice,)


def _rebalance(ev: _Event) -> ParseOutcome:
    instance = ident(ev.detail, "instance-id", ids.EC2_INSTANCE_ID, at="detail")
    notice = ev.notice(
        "aws.ec2.rebalance",
        NoticeKind.REBALANCE_RECOMMENDATION,
        instance,
        deadline=None,
        response=Response.CHECKPOINT_ONLY,
    )
    return (notice,)


def _state_change(ev: _Event) -> ParseOutcome:
    instance = ident(ev.detail, "instance-id", ids.EC2_INSTANCE_ID, at="detail")
    state = text(ev.detail, "state", at="detail")
    if state not in _DEPARTING_STATES:
        return Ignored(f"instance {instance} is {state}, not leaving")
    notice = ev.notice(
        "aws.ec2.state",
        NoticeKind.STATE_CHANGE,
        instance,
        deadline=plus(ev.time, ev.windows.of("ec2_scheduled_s", WINDOWS)),
        extra={"state": state},
    )
    return (notice,)


def _health(ev: _Event) -> ParseOutcome:
    service = text(ev.detail, "service", at="detail")
    category = text(ev.detail, "eventTypeCategory", at="detail")
    if service != "EC2" or category != "scheduledChange":
        return Ignored(f"AWS Health {service} {category} event is not an EC2 scheduled change")
    start_raw = text(ev.detail, "startTime", at="detail")
    start = _health_time(start_raw, "detail.startTime")
    # Health re-sends an event each time it is updated (status, description) under a new
    # EventBridge id; the event ARN names the change itself, and the start time is part of
    # the identity so that a rescheduled change is a new notice with its new deadline.
    event_arn = opt_text(ev.detail, "eventArn", at="detail") or ev.id
    instances: list[str] = []
    for i, entity in enumerate(items(ev.detail, "affectedEntities", at="detail")):
        at = f"detail.affectedEntities[{i}]"
        value = text(as_object(entity, at), "entityValue", at=at)
        if value.startswith("i-"):  # EC2 events may also list volumes or hosts
            ids.EC2_INSTANCE_ID.check(value, f"{at}.entityValue")
            if value not in instances:
                instances.append(value)
    if not instances:
        return Ignored("AWS Health scheduled change names no EC2 instance")
    extra = {
        "event_type_code": opt_text(ev.detail, "eventTypeCode", at="detail"),
        "status_code": opt_text(ev.detail, "statusCode", at="detail"),
        "health_event_arn": event_arn,
    }
    if region := opt_ident(ev.detail, "eventRegion", ids.AWS_REGION, at="detail"):
        extra["region"] = region
    return tuple(
        ev.notice(
            "aws.health",
            NoticeKind.SCHEDULED_CHANGE,
            instance,
            deadline=start,
            notice_id=stable_id("aws.health", event_arn, instance, start_raw),
            extra=extra,
        )
        for instance in instances
    )


def _health_time(raw: str, name: str) -> datetime:
    """Health writes ``Wed, 15 Jan 2025 12:00:00 GMT``; accept RFC 3339 as well."""
    return as_gmt_time(raw, name) if raw.rstrip().endswith("GMT") else as_time(raw, name)


def _lifecycle(
    hook: JSONObject,
    *,
    at: str,
    issued_at: datetime,
    received_at: datetime,
    windows: Windows,
    payload_digest: str,
    region: str = "",
    account: str = "",
) -> ParseOutcome:
    """An ASG ``EC2_INSTANCE_TERMINATING`` lifecycle action, from either delivery path.

    The hook name, token and group are kept so that a later step can complete the lifecycle
    action. The token names the action itself, so the same action delivered both through
    EventBridge and straight to SQS maps to one notice.
    """
    transition = text(hook, "LifecycleTransition", at=at)
    if transition != _TERMINATING:
        return Ignored(f"lifecycle transition {transition} is not a termination")
    instance = ident(hook, "EC2InstanceId", ids.EC2_INSTANCE_ID, at=at)
    token = ident(hook, "LifecycleActionToken", ids.LIFECYCLE_TOKEN, at=at)
    notice = Notice(
        id=stable_id("aws.autoscaling", token, instance),
        source="aws.autoscaling",
        kind=NoticeKind.SCHEDULED_CHANGE,
        target=aws_instance(instance),
        issued_at=issued_at,
        deadline=plus(issued_at, windows.of("ec2_scheduled_s", WINDOWS)),
        received_at=received_at,
        attributes=attributes(
            {
                **Placement(
                    region=region,
                    account=account or opt_ident(hook, "AccountId", ids.AWS_ACCOUNT, at=at),
                ).attributes(),
                **AsgLifecycleFacts(
                    asg_name=ident(hook, "AutoScalingGroupName", ids.ASG_NAME, at=at),
                    lifecycle_hook_name=ident(
                        hook, "LifecycleHookName", ids.LIFECYCLE_HOOK_NAME, at=at
                    ),
                    lifecycle_action_token=token,
                    lifecycle_transition=transition,
                ).attributes(),
                "destination": opt_text(hook, "Destination", at=at),  # EC2 or WarmPool
            }
        ),
        payload_digest=payload_digest,
    )
    return (notice,)


def _asg_eventbridge(ev: _Event) -> ParseOutcome:
    return _lifecycle(
        ev.detail,
        at="detail",
        issued_at=ev.time,
        received_at=ev.received_at,
        windows=ev.windows,
        payload_digest=ev.digest,
        region=ev.region,
        account=ev.account,
    )


KINDS: Mapping[tuple[str, str], Callable[[_Event], ParseOutcome]] = MappingProxyType(
    {
        ("aws.ec2", "EC2 Spot Instance Interruption Warning"): _spot,
        ("aws.ec2", "EC2 Instance Rebalance Recommendation"): _rebalance,
        ("aws.ec2", "EC2 Instance State-change Notification"): _state_change,
        ("aws.health", "AWS Health Event"): _health,
        ("aws.autoscaling", "EC2 Instance-terminate Lifecycle Action"): _asg_eventbridge,
    }
)


def _unwrap_sns(body: JSONObject) -> JSONObject:
    """An SNS → SQS delivery wraps the real body as a JSON string in ``Message``."""
    if body.get("Type") == "Notification" and "Message" in body:
        return as_object(load(as_text(body["Message"], "Message")), "Message")
    return body


def parse(payload: bytes, *, received_at: datetime, windows: Windows) -> ParseOutcome:
    """An SQS message body from EventBridge (EC2, Health, Auto Scaling) or an ASG hook."""
    body = _unwrap_sns(as_object(load(payload), "SQS body"))
    if "detail-type" not in body:
        return _direct_lifecycle(body, received_at=received_at, windows=windows, raw=payload)
    source = text(body, "source")
    detail_type = text(body, "detail-type")
    kind = KINDS.get((source, detail_type))
    if kind is None:
        return Ignored(f"EventBridge {source} {show(detail_type, 80)} is not handled")
    resources = tuple(
        as_text(r, f"resources[{i}]") for i, r in enumerate(opt_items(body, "resources"))
    )
    event = _Event(
        id=text(body, "id"),
        time=issued(time(body, "time"), received_at, "time"),
        region=opt_ident(body, "region", ids.AWS_REGION),
        account=opt_ident(body, "account", ids.AWS_ACCOUNT),
        resources=resources,
        detail=sub(body, "detail"),
        received_at=received_at,
        windows=windows,
        digest=digest(payload),
    )
    return kind(event)


def _direct_lifecycle(
    body: JSONObject, *, received_at: datetime, windows: Windows, raw: bytes
) -> ParseOutcome:
    """The notification an ASG lifecycle hook sends when its target is an SQS queue."""
    if body.get("Event") == _TEST_NOTIFICATION:
        return Ignored("Auto Scaling test notification")
    if "LifecycleTransition" not in body:
        raise ParseError("neither an EventBridge event nor an Auto Scaling lifecycle message")
    return _lifecycle(
        body,
        at="",
        issued_at=issued(time(body, "Time"), received_at, "Time"),
        received_at=received_at,
        windows=windows,
        payload_digest=digest(raw),
    )
