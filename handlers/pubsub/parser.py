"""GCE preemption and host-maintenance system events, from a Cloud Logging sink via Pub/Sub.

Payload forms, told apart by their top-level keys:

- a bare LogEntry (``protoPayload``): what the Python client's ``message.data`` holds;
- one Pub/Sub message (``message`` with base64 ``data``): an item of a pull response, or
  the body of a push request (which adds ``subscription``);
- a whole REST pull response (``receivedMessages``): one notice per message that is one.

Only the System Event audit entries that take a VM away or pause it are notices:
``compute.instances.preempted`` (deadline: entry ``timestamp`` + ``windows.gce_preemption_s``),
``compute.instances.terminateOnHostMaintenance`` (+ ``windows.gce_maintenance_s``) and
``compute.instances.migrateOnHostMaintenance``. A live migration keeps the VM, so it gets
``CHECKPOINT_ONLY``: nothing is taken away, but a checkpoint before the blackout is cheap
insurance. Other methods (``hostError``, ``guestTerminate``, ...) are ``Ignored``.

Target: GKE names the node after the instance, so ``node_name`` is the instance name and
``provider_id`` is ``gce://<project>/<zone>/<name>``, both from ``protoPayload.resourceName``.

Identity: the id hashes the LogEntry's ``operation.id`` (falling back to ``insertId``), never
the Pub/Sub ``messageId``. The operation names the system event itself, so a redelivery,
a second publish of the same entry (a second sink, a replayed subscription: a new
``messageId`` each time) and the first/last entries of one operation all map to one notice.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType

from reclaimd.handlers import ids
from reclaimd.handlers.fields import (
    JSONObject,
    as_object,
    attributes,
    issued,
    items,
    load,
    opt_sub,
    opt_text,
    plus,
    show,
    sub,
    text,
    time,
)
from reclaimd.handlers.targets import gce_instance, gce_region
from reclaimd.model import (
    Ignored,
    Notice,
    NoticeKind,
    ParseError,
    ParseOutcome,
    Response,
    Windows,
    digest,
    stable_id,
)

# Its windows (``Windows.of``): GCE's, which the metadata server's parser reads too.
WINDOWS: Mapping[str, float] = {"gce_preemption_s": 30.0, "gce_maintenance_s": 60.0}

_RESOURCE_NAME = re.compile(
    r"(?://compute\.googleapis\.com/)?projects/([^/]+)/zones/([^/]+)/instances/([^/]+)"
)


@dataclass(frozen=True)
class _Rule:
    source: str
    kind: NoticeKind
    response: Response
    window: Callable[[Windows], float]
    maintenance: str = ""  # terminate | migrate, for host maintenance


METHODS: Mapping[str, _Rule] = MappingProxyType(
    {
        "compute.instances.preempted": _Rule(
            "gcp.compute.preempted",
            NoticeKind.PREEMPTION,
            Response.FULL,
            lambda w: w.of("gce_preemption_s", WINDOWS),
        ),
        "compute.instances.terminateOnHostMaintenance": _Rule(
            "gcp.compute.maintenance",
            NoticeKind.MAINTENANCE,
            Response.FULL,
            lambda w: w.of("gce_maintenance_s", WINDOWS),
            "terminate",
        ),
        "compute.instances.migrateOnHostMaintenance": _Rule(
            "gcp.compute.maintenance",
            NoticeKind.MAINTENANCE,
            Response.CHECKPOINT_ONLY,
            lambda w: w.of("gce_maintenance_s", WINDOWS),
            "migrate",
        ),
    }
)


def _log_entry(
    entry: JSONObject, *, received_at: datetime, windows: Windows, payload_digest: str
) -> Notice | Ignored:
    proto = sub(entry, "protoPayload")
    method = text(proto, "methodName", at="protoPayload")
    rule = METHODS.get(method)
    if rule is None:
        return Ignored(f"system event {show(method, 80)} is not a notice")
    resource_name = text(proto, "resourceName", at="protoPayload")
    match = _RESOURCE_NAME.fullmatch(resource_name)
    if match is None:
        raise ParseError(f"protoPayload.resourceName: not a GCE instance: {show(resource_name)}")
    at_name = "protoPayload.resourceName"
    project = ids.GCP_PROJECT.check(match.group(1), f"{at_name} project")
    zone = ids.GCE_ZONE.check(match.group(2), f"{at_name} zone")
    name = ids.GCE_NAME.check(match.group(3), f"{at_name} instance")
    issued_at = issued(time(entry, "timestamp"), received_at, "timestamp")
    operation_id = opt_text(opt_sub(entry, "operation"), "id", at="operation")
    identity = operation_id or opt_text(entry, "insertId")
    if not identity:
        raise ParseError("LogEntry has neither operation.id nor insertId")
    labels = opt_sub(opt_sub(entry, "resource"), "labels", at="resource")
    gce_id = opt_text(labels, "instance_id", at="resource.labels")
    if gce_id:
        ids.gce_instance_id(gce_id, "resource.labels.instance_id")
    return Notice(
        id=stable_id(rule.source, identity, project, zone, name),
        source=rule.source,
        kind=rule.kind,
        target=gce_instance(project, zone, name),
        issued_at=issued_at,
        deadline=plus(issued_at, rule.window(windows)),
        received_at=received_at,
        response=rule.response,
        attributes=attributes(
            {
                "project": project,
                "zone": zone,
                "region": gce_region(zone),
                "method": method,
                "maintenance": rule.maintenance,
                "gce_instance_id": gce_id,
                "status_message": opt_text(
                    opt_sub(proto, "status", at="protoPayload"),
                    "message",
                    at="protoPayload.status",
                ),
            }
        ),
        payload_digest=payload_digest,
    )


def _pubsub_data(message: JSONObject, at: str) -> JSONObject:
    """The LogEntry a sink published: base64 JSON in ``message.data``."""
    data = text(message, "data", at=at)
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ParseError(f"{at}.data: not base64") from e
    return as_object(load(raw), f"{at}.data")


def parse(payload: bytes, *, received_at: datetime, windows: Windows) -> ParseOutcome:
    """A LogEntry, a pulled or pushed Pub/Sub message, or a pull response."""
    body = as_object(load(payload), "payload")
    if "receivedMessages" in body:
        entries = [
            _pubsub_data(
                sub(as_object(m, f"receivedMessages[{i}]"), "message", at=f"receivedMessages[{i}]"),
                f"receivedMessages[{i}].message",
            )
            for i, m in enumerate(items(body, "receivedMessages"))
        ]
    elif "message" in body:
        entries = [_pubsub_data(sub(body, "message"), "message")]
    elif "protoPayload" in body:
        entries = [body]
    else:
        raise ParseError("neither a LogEntry nor a Pub/Sub message")
    notices: dict[str, Notice] = {}
    ignored: list[str] = []
    for entry in entries:
        outcome = _log_entry(
            entry, received_at=received_at, windows=windows, payload_digest=digest(payload)
        )
        if isinstance(outcome, Ignored):
            ignored.append(outcome.reason)
        else:
            notices.setdefault(outcome.id, outcome)  # one pull may hold a redelivery
    if notices:
        return tuple(notices.values())
    return Ignored("; ".join(dict.fromkeys(ignored)) or "empty pull response")
