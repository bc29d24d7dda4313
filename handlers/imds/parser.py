"""EC2 instance metadata (IMDS) notices, as the per-node poller hands them over.

Payload: the IMDS notice bodies do not say which instance they are about (IMDS serves the
instance id at another path), so the transport wraps each non-404 response in an envelope:

    {"instance_id": "i-0abc...", "path": "spot/instance-action", "body": "<response text>",
     "zone": "us-east-2a", "region": "us-east-2", "node_name": "ip-10-0-0-1...",
     "instance_type": "p5.48xlarge"}

``instance_id``, ``path`` and ``body`` are required. ``path`` is relative to
``/latest/meta-data/`` (the full path is accepted too). ``body`` is the response text as
received; an already decoded JSON value is accepted as well. The other keys are optional and
fill the target (``zone`` gives the ``providerID``, ``node_name`` the node a DaemonSet runs
on) and the attributes.

Paths: ``spot/instance-action`` (``{"action", "time"}``, ``time`` being when the instance
goes: that is the deadline), ``events/recommendations/rebalance`` (``{"noticeTime"}``, an
early warning: checkpoint only, no deadline), ``events/maintenance/scheduled`` (a list of
``{"EventId", "Code", "State", "NotBefore", ...}``; one notice per ``active`` event,
deadline ``NotBefore``) and ``autoscaling/target-lifecycle-state`` (plain text; only
``Terminated`` is a notice). Another path is a transport bug: ``ParseError``.

Identity: IMDS has no message id and the poller reads the same body on every poll, so the id
hashes the instance and what the body says (for scheduled events their ``EventId``). Repeat
polls map to one notice; a changed body is a new one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType
from typing import Any

from reclaimd.handlers import ids
from reclaimd.handlers.fields import (
    as_gmt_time,
    as_list,
    as_object,
    as_text,
    attributes,
    ident,
    issued,
    load,
    member,
    opt_ident,
    opt_text,
    plus,
    show,
    text,
    time,
)
from reclaimd.handlers.targets import aws_instance
from reclaimd.model import (
    Ignored,
    Notice,
    NoticeKind,
    ParseError,
    ParseOutcome,
    Response,
    Windows,
    digest,
    rfc3339,
    stable_id,
)

# Its windows (``Windows.of``): EC2's, which the EventBridge parser reads too.
WINDOWS: Mapping[str, float] = {"ec2_spot_s": 120.0, "ec2_scheduled_s": 120.0}

_PREFIX = "latest/meta-data/"


@dataclass(frozen=True)
class _Envelope:
    instance_id: str
    zone: str
    region: str
    node_name: str
    instance_type: str
    body: Any
    received_at: datetime
    windows: Windows
    digest: str

    def json_body(self) -> Any:
        return load(self.body) if isinstance(self.body, str) else self.body

    def notice(
        self,
        source: str,
        kind: NoticeKind,
        identity: tuple[str, ...],
        *,
        issued_at: datetime,
        deadline: datetime | None,
        response: Response = Response.FULL,
        **extra: str,
    ) -> Notice:
        return Notice(
            id=stable_id(source, self.instance_id, *identity),
            source=source,
            kind=kind,
            target=aws_instance(self.instance_id, zone=self.zone, node_name=self.node_name),
            issued_at=issued_at,
            deadline=deadline,
            received_at=self.received_at,
            response=response,
            attributes=attributes(
                {
                    "region": self.region,
                    "zone": self.zone,
                    "instance_type": self.instance_type,
                    **extra,
                }
            ),
            payload_digest=self.digest,
        )


def _spot(env: _Envelope) -> ParseOutcome:
    body = as_object(env.json_body(), "body")
    action = text(body, "action", at="body")
    when = time(body, "time", at="body")
    # IMDS gives the time of the action; the warning went out one Spot window before it.
    notice = env.notice(
        "aws.imds.spot",
        NoticeKind.SPOT_INTERRUPTION,
        (action, rfc3339(when)),
        issued_at=issued(
            plus(when, -env.windows.of("ec2_spot_s", WINDOWS)), env.received_at, "body.time"
        ),
        deadline=when,
        instance_action=action,
    )
    return (notice,)


def _rebalance(env: _Envelope) -> ParseOutcome:
    body = as_object(env.json_body(), "body")
    noticed = time(body, "noticeTime", at="body")
    notice = env.notice(
        "aws.imds.rebalance",
        NoticeKind.REBALANCE_RECOMMENDATION,
        (rfc3339(noticed),),
        issued_at=noticed,
        deadline=None,
        response=Response.CHECKPOINT_ONLY,
    )
    return (notice,)


def _scheduled(env: _Envelope) -> ParseOutcome:
    notices: list[Notice] = []
    for i, item in enumerate(as_list(env.json_body(), "body")):
        at = f"body[{i}]"
        event = as_object(item, at)
        state = text(event, "State", at=at)  # active | completed | canceled
        if state != "active":
            continue
        event_id = text(event, "EventId", at=at)
        not_before = as_gmt_time(member(event, "NotBefore", at=at), f"{at}.NotBefore")
        not_after = opt_text(event, "NotAfter", at=at)
        if not_after:
            as_gmt_time(not_after, f"{at}.NotAfter")  # validated, kept verbatim
        # The event says when it starts, not when it was announced (often days earlier),
        # so "issued" is when reclaimd first saw it.
        notices.append(
            env.notice(
                "aws.imds.scheduled",
                NoticeKind.SCHEDULED_CHANGE,
                (event_id, rfc3339(not_before)),
                issued_at=env.received_at,
                deadline=not_before,
                code=text(event, "Code", at=at),
                event_id=event_id,
                not_after=not_after,
            )
        )
    return tuple(notices) if notices else Ignored("no active scheduled event")


def _target_lifecycle_state(env: _Envelope) -> ParseOutcome:
    state = as_text(env.body, "body").strip()
    if state != "Terminated":
        return Ignored(f"target lifecycle state {show(state)} is not Terminated")
    # Plain text carries no time: the ASG is terminating the instance now.
    notice = env.notice(
        "aws.imds.asg",
        NoticeKind.SCHEDULED_CHANGE,
        (state,),
        issued_at=env.received_at,
        deadline=plus(env.received_at, env.windows.of("ec2_scheduled_s", WINDOWS)),
        target_lifecycle_state=state,
    )
    return (notice,)


PATHS: Mapping[str, Callable[[_Envelope], ParseOutcome]] = MappingProxyType(
    {
        "spot/instance-action": _spot,
        "events/recommendations/rebalance": _rebalance,
        "events/maintenance/scheduled": _scheduled,
        "autoscaling/target-lifecycle-state": _target_lifecycle_state,
    }
)


def parse(payload: bytes, *, received_at: datetime, windows: Windows) -> ParseOutcome:
    """An IMDS response in the poller's envelope (see the module docstring)."""
    envelope = as_object(load(payload), "IMDS envelope")
    path = text(envelope, "path").strip().lstrip("/").removeprefix(_PREFIX)
    handler = PATHS.get(path)
    if handler is None:
        raise ParseError(f"path: not an IMDS notice path: {show(path)}")
    # The zone grammar takes Local and Wavelength zones (``us-west-2-lax-1a``) too.
    region = opt_ident(envelope, "region", ids.AWS_REGION)
    zone = opt_text(envelope, "zone")
    if zone:
        ids.aws_zone(zone, "zone", region)
    env = _Envelope(
        instance_id=ident(envelope, "instance_id", ids.EC2_INSTANCE_ID),
        zone=zone,
        region=region,
        node_name=opt_ident(envelope, "node_name", ids.K8S_NAME),
        instance_type=opt_ident(envelope, "instance_type", ids.EC2_INSTANCE_TYPE),
        body=member(envelope, "body"),
        received_at=received_at,
        windows=windows,
        digest=digest(payload),
    )
    return handler(env)


def _path_of(body: Any) -> str:
    """Which notice path a bare IMDS body was read from, by its shape."""
    if isinstance(body, list):
        return "events/maintenance/scheduled"
    if isinstance(body, dict):
        if "action" in body:
            return "spot/instance-action"
        if "noticeTime" in body:
            return "events/recommendations/rebalance"
    raise ParseError(
        "body: not an IMDS notice body (spot/instance-action, events/recommendations/rebalance,"
        " events/maintenance/scheduled or autoscaling/target-lifecycle-state): save one of those"
        " paths' responses, or the poller's envelope"
    )


def parse_saved(
    payload: bytes, *, received_at: datetime, windows: Windows, target: str = ""
) -> ParseOutcome:
    """What ``reclaimd parse`` reads: the poller's envelope, or a body as IMDS returns it
    (``curl -H "X-aws-ec2-metadata-token: $T" http://169.254.169.254/latest/meta-data/spot/
    instance-action > body.json``) for the instance ``target`` names (``--vm i-0abc...``: a
    body does not say whose it is). Its path is told by its shape: ``{"action", "time"}``,
    ``{"noticeTime"}``, a list of scheduled events, or the plain-text lifecycle state."""
    text_body = payload.decode("utf-8", "replace").strip()
    try:
        body: Any = load(payload)
    except ParseError:
        body = text_body  # plain text: autoscaling/target-lifecycle-state
    if isinstance(body, dict) and "path" in body:  # the poller's envelope
        if target and target != body.get("instance_id"):
            raise ParseError(
                f"vm: {show(target)} is not the envelope's instance_id: leave --vm out"
            )
        return parse(payload, received_at=received_at, windows=windows)
    if isinstance(body, str):
        if not body or body.startswith(("{", "[")):
            raise ParseError("body: empty or not JSON: save the IMDS response as it came")
        path = "autoscaling/target-lifecycle-state"
    else:
        path = _path_of(body)
    if not target:
        raise ParseError(
            "an IMDS body does not name its instance: add --vm <instance id> (IMDS serves it"
            " at /latest/meta-data/instance-id)"
        )
    instance = ids.EC2_INSTANCE_ID.check(target, "vm")
    envelope = {"instance_id": instance, "path": path, "body": body}
    return parse(json.dumps(envelope).encode(), received_at=received_at, windows=windows)
