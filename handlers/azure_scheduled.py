"""Azure Scheduled Events, as the per-node poller hands them over (AKS Spot node pools).

Payload: the Scheduled Events document (``GET /metadata/scheduledevents?api-version=2020-07-01``)
lists events for every VM in the availability set or scale-set placement group, so the
poller wraps it with this VM's identity (read once from ``/metadata/instance/compute``):

    {"vm_name": "aks-spotgpu-12345678-vmss_3",
     "resource_id": "/subscriptions/.../virtualMachineScaleSets/<vmss>/virtualMachines/3",
     "node_name": "aks-spotgpu-12345678-vmss000003", "vm_size": "Standard_ND96isr_H100_v5",
     "priority": "Spot", "location": "eastus", "zone": "1",
     "document": {"DocumentIncarnation": 7, "Events": [...]}}

``vm_name`` (IMDS ``compute.name``, what ``Resources`` lists) and ``document`` (an object, or
the response text) are required; the rest fill the target and the attributes. ``resource_id``
gives the node's ``azure://`` providerID (``azure_ids``) and must name ``vm_name``.

Events (Microsoft's "Scheduled Events for Linux VMs", api-version 2020-07-01): only events
whose ``Resources`` include ``vm_name`` concern this node; the others are skipped, though
every event must be well formed (the api-version pins the schema: an unknown ``EventType``
or ``EventStatus`` is a ``ParseError``). For this VM:

- ``Preempt`` (Spot eviction, at least 30 s notice): a preemption, full response;
- ``Terminate`` (scale-set delete with terminate notification, 5-15 min): a scheduled change,
  full response;
- ``Reboot`` and ``Redeploy`` (memory, or ephemeral disks and the host, are lost; at least 15 and
  10 min notice): maintenance, full response, as GCE's terminate-on-host-maintenance;
- ``Freeze`` (a pause of seconds, memory and open files kept): ``Ignored``, whatever its
  status: a training step stalls and resumes, and a drain would cost far more.

The deadline is ``NotBefore`` (RFC 1123) for a ``Scheduled`` event. A ``Started`` event (its
``NotBefore`` is blank; a host failure skips ``Scheduled`` altogether), or a ``Scheduled`` one
with a blank ``NotBefore``, is acted on at once: deadline = receipt. ``issued_at`` is the
receipt too: the document does not say when the event was announced.

Identity: the id hashes the VM and the ``EventId`` only, so the same event read again (a new
``DocumentIncarnation``, or ``Scheduled`` turning ``Started`` after our own approval) is one
notice the intake absorbs.

Approval: a notice is ``approvable`` (the transport may POST ``StartRequests`` for it after the
drain) only while ``Scheduled`` and when this VM is its only resource: approving an event
starts it for every VM it lists, and the others may still be draining.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType
from typing import Any

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
    rfc3339,
    stable_id,
)

from . import azure_ids, ids
from .fields import (
    as_gmt_time,
    as_object,
    as_text,
    attributes,
    ident,
    items,
    load,
    member,
    opt_ident,
    opt_text,
    show,
)

SOURCES = ("azure.scheduled.preempt", "azure.scheduled.terminate", "azure.scheduled.maintenance")
STATUSES = ("Scheduled", "Started")
EVENT_SOURCES = ("Platform", "User")
_DESCRIPTION_MAX = 120


@dataclass(frozen=True)
class _Rule:
    source: str
    kind: NoticeKind
    response: Response


# EventType -> rule, or the reason it is no notice.
TYPES: Mapping[str, _Rule | str] = MappingProxyType(
    {
        "Preempt": _Rule(SOURCES[0], NoticeKind.PREEMPTION, Response.FULL),
        "Terminate": _Rule(SOURCES[1], NoticeKind.SCHEDULED_CHANGE, Response.FULL),
        "Reboot": _Rule(SOURCES[2], NoticeKind.MAINTENANCE, Response.FULL),
        "Redeploy": _Rule(SOURCES[2], NoticeKind.MAINTENANCE, Response.FULL),
        "Freeze": "pauses the VM for seconds (memory and open files kept)",
    }
)


@dataclass(frozen=True)
class _Event:
    """One event of the document, read and checked."""

    event_id: str
    event_type: str
    status: str
    resources: tuple[str, ...]
    not_before: datetime | None
    source: str
    duration_s: str
    description: str

    def names(self) -> set[str]:
        """The VMs it concerns; Azure resource names are case-insensitive."""
        return {r.lower() for r in self.resources}


@dataclass(frozen=True)
class _Node:
    """This VM, from the envelope."""

    vm_name: str
    target: Target
    facts: Mapping[str, str]


def _int(value: Any, name: str) -> int:
    # bool is an int to Python, and never an incarnation or a duration.
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and re.fullmatch(r"-?[0-9]{1,18}", value.strip(), re.ASCII):
        return int(value)
    raise ParseError(f"{name}: expected an integer, got {show(value)}")


def _one_line(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= _DESCRIPTION_MAX else flat[: _DESCRIPTION_MAX - 3] + "..."


def _choice(value: str, allowed: tuple[str, ...], name: str) -> str:
    if value not in allowed:
        raise ParseError(f"{name}: {show(value)} is not one of {', '.join(allowed)}")
    return value


def _event(raw: Any, at: str) -> _Event:
    event = as_object(raw, at)
    resource_type = opt_text(event, "ResourceType", at=at)
    if resource_type:
        _choice(resource_type, ("VirtualMachine",), f"{at}.ResourceType")
    # Other VMs' names are only compared with ours, never used: read as text, not as ids.
    resources = tuple(
        as_text(r, f"{at}.Resources[{i}]").strip()
        for i, r in enumerate(items(event, "Resources", at=at))
    )
    not_before = opt_text(event, "NotBefore", at=at)
    source = opt_text(event, "EventSource", at=at)
    duration = event.get("DurationInSeconds")
    return _Event(
        event_id=ident(event, "EventId", azure_ids.EVENT_ID, at=at),
        event_type=_choice(
            as_text(member(event, "EventType", at=at), f"{at}.EventType"),
            tuple(TYPES),
            f"{at}.EventType",
        ),
        status=_choice(
            as_text(member(event, "EventStatus", at=at), f"{at}.EventStatus"),
            STATUSES,
            f"{at}.EventStatus",
        ),
        resources=resources,
        not_before=as_gmt_time(not_before, f"{at}.NotBefore") if not_before else None,
        source=_choice(source, EVENT_SOURCES, f"{at}.EventSource") if source else "",
        duration_s=str(_int(duration, f"{at}.DurationInSeconds")) if duration is not None else "",
        description=_one_line(opt_text(event, "Description", at=at)),
    )


def _node(envelope: Mapping[str, Any]) -> _Node:
    vm_name = ident(envelope, "vm_name", azure_ids.VM_RESOURCE_NAME)
    node_name = opt_ident(envelope, "node_name", ids.K8S_NAME)
    raw_id = opt_text(envelope, "resource_id")
    facts: dict[str, str] = {"vm_name": vm_name}
    provider_id = ""
    if raw_id:
        vm = azure_ids.resource_id(raw_id.strip(), "resource_id")
        if vm.name.lower() != vm_name.lower():
            raise ParseError(f"resource_id: names VM {show(vm.name)}, not {show(vm_name)}")
        provider_id = vm.provider_id
        facts.update(vm.facts())
    priority = opt_text(envelope, "priority")
    if priority:
        _choice(priority, azure_ids.PRIORITIES, "priority")
    location = opt_ident(envelope, "location", azure_ids.LOCATION)
    facts.update(
        {
            "vm_size": opt_ident(envelope, "vm_size", azure_ids.VM_SIZE),
            "priority": priority,
            "location": location,
            "region": location,
            "zone": opt_ident(envelope, "zone", azure_ids.ZONE),
        }
    )
    target = Target(instance_id=vm_name, provider_id=provider_id, node_name=node_name)
    return _Node(vm_name, target, facts)


def _notice(
    event: _Event, rule: _Rule, node: _Node, *, received_at: datetime, payload: bytes
) -> Notice:
    scheduled = event.status == "Scheduled"
    deadline = event.not_before if scheduled and event.not_before else received_at
    approvable = scheduled and event.names() == {node.vm_name.lower()}
    return Notice(
        id=stable_id(rule.source, node.vm_name, event.event_id),
        source=rule.source,
        kind=rule.kind,
        target=node.target,
        issued_at=received_at,
        deadline=deadline,
        received_at=received_at,
        response=rule.response,
        attributes=attributes(
            {
                **node.facts,
                "event_id": event.event_id,
                "event_type": event.event_type,
                "event_status": event.status,
                "event_source": event.source,
                "not_before": rfc3339(event.not_before) if event.not_before else "",
                "duration_s": event.duration_s,
                "description": event.description,
                "resources": str(len(event.resources)),
                "approvable": "true" if approvable else "",
            }
        ),
        payload_digest=digest(payload),
    )


def parse(payload: bytes, *, received_at: datetime, windows: Windows) -> ParseOutcome:
    """A Scheduled Events document in the poller's envelope (see the module docstring)."""
    envelope = as_object(load(payload), "scheduled events envelope")
    node = _node(envelope)
    body = member(envelope, "document")
    document = as_object(load(body) if isinstance(body, str) else body, "document")
    _int(member(document, "DocumentIncarnation", at="document"), "document.DocumentIncarnation")
    events = [
        _event(raw, f"document.Events[{i}]")
        for i, raw in enumerate(items(document, "Events", at="document"))
    ]
    notices: list[Notice] = []
    reasons: list[str] = []
    for event in events:
        if node.vm_name.lower() not in event.names():
            continue
        rule = TYPES[event.event_type]
        if isinstance(rule, str):
            reasons.append(f"{event.event_type} {event.event_id}: {rule}")
            continue
        notices.append(_notice(event, rule, node, received_at=received_at, payload=payload))
    if notices:
        return tuple(notices)
    if reasons:
        return Ignored("; ".join(reasons))
    if events:
        return Ignored(f"{len(events)} event(s), none for {node.vm_name}")
    return Ignored("no scheduled events")
