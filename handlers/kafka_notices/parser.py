"""Generic notices from the Kafka notices topic: CloudEvents 1.0, structured-mode JSON.

Any producer (a scheduler, another controller, a drill) can ask for the runbook by writing
an event whose ``type`` names the kind of notice, one type per ``NoticeKind``:

| type                                           | default response |
|------------------------------------------------|------------------|
| io.reclaimd.notice.spot_interruption.v1        | full             |
| io.reclaimd.notice.rebalance_recommendation.v1 | checkpoint_only  |
| io.reclaimd.notice.preemption.v1               | full             |
| io.reclaimd.notice.maintenance.v1              | full             |
| io.reclaimd.notice.reclaim.v1                  | no_cordon        |
| io.reclaimd.notice.scheduled_change.v1         | full             |
| io.reclaimd.notice.state_change.v1             | full             |

An event::

    {"specversion": "1.0", "id": "e-42", "source": "//drills/us-east-2",
     "type": "io.reclaimd.notice.spot_interruption.v1", "time": "2025-01-01T12:00:00Z",
     "datacontenttype": "application/json",
     "data": {"target": {"node_name": "ip-10-0-0-1", "instance_id": "i-0abc"},
              "deadline": "2025-01-01T12:02:00Z", "response": "full",
              "attributes": {"region": "us-east-2"}}}

``data.target`` has the shape of ``Target.to_json()`` (``instance_id``, ``provider_id``,
``node_name``, ``workload: {namespace, name, uid}``; at least one). ``deadline``,
``response`` (overrides the default above) and ``attributes`` (string to string) are
optional. Without ``deadline`` a ``checkpoint_only`` notice has none (an early warning) and
any other gets ``time`` + ``windows.default_s``. ``time`` is optional in CloudEvents; without
it the notice is issued when received.
A ``traceparent`` extension attribute is kept so that the trace continues the producer's.

Identity: ``Notice.source`` is ``kafka:<source>`` and the id hashes it with the event ``id``:
CloudEvents defines (source, id) as unique per event, so a producer's retry is one notice.
A ``type`` not in the table is ``Ignored``: the topic may carry other events.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from types import MappingProxyType

from reclaimd.handlers import ids
from reclaimd.handlers.fields import (
    JSONObject,
    as_object,
    as_text,
    attributes,
    ident,
    issued,
    load,
    opt_ident,
    opt_sub,
    opt_text,
    plus,
    show,
    sub,
    text,
    time,
)
from reclaimd.model import (
    Ignored,
    Notice,
    NoticeKind,
    ParseError,
    ParseOutcome,
    Response,
    Target,
    TraceContext,
    Windows,
    WorkloadRef,
    digest,
    stable_id,
)

TYPES: Mapping[str, NoticeKind] = MappingProxyType(
    {f"io.reclaimd.notice.{kind.value}.v1": kind for kind in NoticeKind}
)
DEFAULT_RESPONSES: Mapping[NoticeKind, Response] = MappingProxyType(
    {
        NoticeKind.REBALANCE_RECOMMENDATION: Response.CHECKPOINT_ONLY,
        NoticeKind.RECLAIM: Response.NO_CORDON,
    }
)


def _target(data: JSONObject) -> Target:
    raw = sub(data, "target", at="data")
    at = "data.target"
    workload = None
    if raw.get("workload") is not None:
        wl = sub(raw, "workload", at=at)
        workload = WorkloadRef(
            namespace=ident(wl, "namespace", ids.K8S_NAMESPACE, at=f"{at}.workload"),
            name=ident(wl, "name", ids.K8S_NAME, at=f"{at}.workload"),
            uid=opt_ident(wl, "uid", ids.K8S_UID, at=f"{at}.workload"),
        )
    target = Target(
        instance_id=opt_ident(raw, "instance_id", ids.CLOUD_INSTANCE, at=at),
        provider_id=opt_ident(raw, "provider_id", ids.PROVIDER_ID, at=at),
        node_name=opt_ident(raw, "node_name", ids.K8S_NAME, at=at),
        workload=workload,
    )
    if target == Target():
        raise ParseError(f"{at}: names nothing (instance_id, provider_id, node_name, workload)")
    return target


def _response(data: JSONObject, kind: NoticeKind) -> Response:
    value = opt_text(data, "response", at="data")
    if not value:
        return DEFAULT_RESPONSES.get(kind, Response.FULL)
    try:
        return Response(value)
    except ValueError as e:
        allowed = ", ".join(r.value for r in Response)
        raise ParseError(f"data.response: {show(value)} is not one of {allowed}") from e


def _attributes(data: JSONObject) -> dict[str, str]:
    return {
        as_text(key, "data.attributes key"): as_text(value, f"data.attributes.{key}")
        for key, value in opt_sub(data, "attributes", at="data").items()
    }


def _data(event: JSONObject) -> JSONObject:
    if "data_base64" in event:
        raise ParseError("data_base64: binary data is not supported; send JSON data")
    content_type = opt_text(event, "datacontenttype").partition(";")[0].strip().lower()
    if content_type and content_type != "application/json" and not content_type.endswith("+json"):
        raise ParseError(f"datacontenttype: {show(content_type)} is not JSON")
    return sub(event, "data")


def parse(payload: bytes, *, received_at: datetime, windows: Windows) -> ParseOutcome:
    """A structured-mode CloudEvent from the notices topic (see the module docstring)."""
    event = as_object(load(payload), "CloudEvent")
    if text(event, "specversion") != "1.0":
        raise ParseError(f"specversion: {show(event['specversion'])} is not 1.0")
    ce_source = ident(event, "source", ids.CLOUDEVENT_SOURCE)
    ce_id, ce_type = text(event, "id"), text(event, "type")
    kind = TYPES.get(ce_type)
    if kind is None:
        return Ignored(f"CloudEvent type {show(ce_type, 80)} is not a notice")
    data = _data(event)
    issued_at = (
        issued(time(event, "time"), received_at, "time")
        if event.get("time") is not None
        else received_at
    )
    response = _response(data, kind)
    if data.get("deadline") is not None:
        deadline: datetime | None = time(data, "deadline", at="data")
    elif response is Response.CHECKPOINT_ONLY:
        deadline = None  # an early warning: nothing is taken away, so nothing to be late for
    else:
        deadline = plus(issued_at, windows.default_s)
    source = f"kafka:{ce_source}"
    attrs = _attributes(data)
    attrs.update(TraceContext(opt_ident(event, "traceparent", ids.TRACEPARENT)).attributes())
    notice = Notice(
        id=stable_id(source, ce_id),
        source=source,
        kind=kind,
        target=_target(data),
        issued_at=issued_at,
        deadline=deadline,
        received_at=received_at,
        response=response,
        attributes=attributes(attrs),
        payload_digest=digest(payload),
    )
    return (notice,)
