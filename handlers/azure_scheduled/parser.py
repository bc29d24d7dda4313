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
gives the node's ``azure://`` providerID (``provider_id`` below) and must name ``vm_name``.

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

from reclaimd.handlers import ids
from reclaimd.handlers.fields import (
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
    plus,
    show,
)
from reclaimd.handlers.ids import Grammar
from reclaimd.model import (
    Facts,
    Ignored,
    Notice,
    NoticeKind,
    ParseError,
    ParseOutcome,
    Placement,
    Response,
    Target,
    Windows,
    digest,
    rfc3339,
    stable_id,
)

# --- Azure identifiers ----------------------------------------------------------------------
# VM and scale-set instance names, resource IDs, ``azure://`` provider IDs: this source's own
# (``ids.Grammar``s like the shared ones in ``ids.py``). The resource ID's shape, the
# ``azure://`` prefix and the registry's providerID mapping for Azure nodes are in ``ids.py``
# (``ids.AZURE_VM_ID``, ``ids.azure_instance``).
#
# - subscription ids: a GUID;
# - resource group names: 1-90 of ``[-\\w.()]``, not ending in ``.`` (Azure also allows
#   non-ASCII letters; refused here, as ``ids.py`` refuses other scripts: an id goes into a field
#   selector and a log line);
# - VM and scale-set names: 1-64 of ``[A-Za-z0-9.-]``, starting and ending alphanumeric (Linux
#   VM rules; no ``_``, which Azure refuses in both);
# - a scale-set instance's VM name (what IMDS ``compute.name`` and Scheduled Events
#   ``Resources`` show): ``<scale set>_<instance>``, the instance a decimal id (Uniform) or an
#   8-character hex suffix (Flexible);
# - Scheduled Events ``EventId``: documented as a GUID; any 1-64 of ``[A-Za-z0-9-]`` is taken,
#   so a differently shaped id from the platform does not cost a Spot notice.
#
# Resource and provider IDs have two VM shapes (ARM segment names match case-insensitively, as
# ARM does):
#
# - ``/subscriptions/<sub>/resourceGroups/<rg>/providers/Microsoft.Compute/`` +
#   ``virtualMachineScaleSets/<vmss>/virtualMachines/<n>`` (a Uniform scale-set instance: AKS
#   node pools),
# - the same prefix + ``virtualMachines/<name>`` (a standalone or availability-set VM, and a
#   Flexible scale-set instance).
#
# A node's providerID is ``azure://`` + that resource ID, with the resource group lowercased:
# cloud-provider-azure writes it so "for historical reasons", and the IMDS ``resourceId`` keeps
# the group's case (``MC_rg_cluster_region``), so ``AzureVm.provider_id`` lowercases it.


def _grammar(what: str, pattern: str, max_len: int) -> Grammar:
    return Grammar(what, re.compile(pattern, re.ASCII), max_len)


_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,62}[A-Za-z0-9])?"
_INSTANCE = r"[0-9]{1,10}"
_FLEX_SUFFIX = r"[0-9a-f]{8}"
_RG = r"[-\w.()]{0,89}[-\w()]"

SUBSCRIPTION = _grammar(
    "an Azure subscription id", r"[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}", 36
)
RESOURCE_GROUP = _grammar("an Azure resource group name", _RG, 90)
VM_NAME = _grammar("an Azure VM name", _NAME, 64)
SCALE_SET_NAME = _grammar("an Azure scale set name", _NAME, 64)
# What IMDS and Scheduled Events call the VM: a plain VM name or <scale set>_<instance>.
VM_RESOURCE_NAME = _grammar(
    "an Azure VM or scale-set instance name",
    rf"{_NAME}(?:_(?:{_INSTANCE}|{_FLEX_SUFFIX}))?",
    64,
)
EVENT_ID = _grammar("a Scheduled Events EventId", r"[A-Za-z0-9][A-Za-z0-9-]{0,63}", 64)
# Standard_ND96isr_H100_v5, Standard_NC24ads_A100_v4, Basic_A0.
VM_SIZE = _grammar("an Azure VM size", r"[A-Za-z]+_[A-Za-z0-9_-]+", 64)
LOCATION = _grammar("an Azure region name", r"[a-z][a-z0-9]{1,39}", 40)
ZONE = _grammar("an Azure availability zone", r"[1-9]", 1)
PRIORITIES = ("Regular", "Spot", "Low")  # IMDS compute.priority ("Low": legacy low priority)

_ID = ids.AZURE_VM_ID  # the shape; each part is checked below
_MAX_ID = 512
PROVIDER_PREFIX = ids.AZURE_PROVIDER_PREFIX


@dataclass(frozen=True)
class AzureVm:
    """One Azure VM as its resource ID names it."""

    subscription: str
    resource_group: str  # as given; ``provider_id`` lowercases it
    name: str  # the VM name IMDS and Scheduled Events show (``<vmss>_<n>`` in a scale set)
    scale_set: str = ""  # a Uniform scale set's name (empty for a plain or Flexible VM)
    instance: str = ""  # a Uniform scale-set instance id

    @property
    def resource_id(self) -> str:
        head = f"/subscriptions/{self.subscription}/resourceGroups/{self.resource_group}"
        if self.scale_set:
            tail = f"virtualMachineScaleSets/{self.scale_set}/virtualMachines/{self.instance}"
        else:
            tail = f"virtualMachines/{self.name}"
        return f"{head}/providers/Microsoft.Compute/{tail}"

    @property
    def provider_id(self) -> str:
        """The node's ``spec.providerID`` as cloud-provider-azure writes it."""
        vm = AzureVm(
            self.subscription, self.resource_group.lower(), self.name, self.scale_set, self.instance
        )
        return PROVIDER_PREFIX + vm.resource_id

    @property
    def instance_id(self) -> str:
        """The cloud instance id the ledger keys on: the VM name (unique in its group)."""
        return self.name

    def focus_resource_id(self) -> str:
        """The ``ResourceId`` an Azure cost export (FOCUS) is expected to carry: the ARM id,
        lowercased; a Uniform scale-set instance is billed on its scale set (assumed from
        Cost Management's usage records; check against a real export before relying on it)."""
        if self.scale_set:
            scale_set = (
                f"/subscriptions/{self.subscription}/resourceGroups/{self.resource_group}"
                f"/providers/Microsoft.Compute/virtualMachineScaleSets/{self.scale_set}"
            )
            return scale_set.lower()
        return self.resource_id.lower()

    def facts(self) -> Mapping[str, str]:
        """The cloud facts a providerID determines (empty values left out)."""
        pairs = {
            "subscription": self.subscription,
            "resource_group": self.resource_group.lower(),
            "vm_name": self.name,
            "scale_set": self.scale_set,
            "scale_set_instance": self.instance,
        }
        return {k: v for k, v in pairs.items() if v}


def _show(value: str) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def resource_id(value: str, name: str) -> AzureVm:
    """A VM's ARM resource ID (either shape above), or a one-line ``ParseError``."""
    match = _ID.fullmatch(value) if len(value) <= _MAX_ID else None
    if match is None:
        raise ParseError(f"{name}: not an Azure VM resource ID: {_show(value)}")
    sub = SUBSCRIPTION.check(match["sub"], f"{name} subscription")
    rg = RESOURCE_GROUP.check(match["rg"], f"{name} resource group")
    if match["vm"] is not None:
        return AzureVm(sub, rg, VM_RESOURCE_NAME.check(match["vm"], f"{name} VM name"))
    vmss = SCALE_SET_NAME.check(match["vmss"], f"{name} scale set")
    n = match["n"]
    if not re.fullmatch(_INSTANCE, n, re.ASCII):
        raise ParseError(f"{name}: not a scale-set instance id: {_show(n)}")
    return AzureVm(sub, rg, f"{vmss}_{n}", vmss, n)


def provider_id(value: str, name: str = "providerID") -> AzureVm:
    """An AKS node's ``azure:///subscriptions/...`` providerID, or a one-line ``ParseError``.

    The pure providerID -> instance mapping: ``.instance_id`` and ``.facts()``.
    """
    if not value.startswith(PROVIDER_PREFIX):
        raise ParseError(f"{name}: not an azure:// provider ID: {_show(value)}")
    return resource_id(value.removeprefix(PROVIDER_PREFIX), name)


def is_provider_id(value: str) -> bool:
    try:
        provider_id(value)
    except ParseError:
        return False
    return True


# --- this source's facts (its registry entry's ``facts``) -------------------------------------


@dataclass(frozen=True)
class AzureVmFacts(Facts):
    """The Azure VM a Scheduled Events notice is for, beyond its ``Placement``: its ARM
    resource's parts and its priority (IMDS ``compute.priority``: Regular, Spot or Low)."""

    vm_name: str = ""
    subscription: str = ""
    resource_group: str = ""
    scale_set: str = ""
    scale_set_instance: str = ""
    priority: str = ""


@dataclass(frozen=True)
class AzureEventFacts(Facts):
    """The Scheduled Event a notice came from: what approving it after the drain takes
    (``event_id`` when ``approvable``), and what the document said of it."""

    event_id: str = ""
    event_type: str = ""
    event_status: str = ""
    event_source: str = ""
    not_before: str = ""
    duration_s: str = ""
    description: str = ""
    resources: str = ""  # how many VMs the event lists
    approvable: str = ""  # "true": Scheduled, and this VM its only resource


# --- the parser -------------------------------------------------------------------------------

# Its window (``Windows.of``): a Spot eviction's documented minimum notice, for a Scheduled
# Preempt whose NotBefore is blank (the others' are minutes, and such an event is acted on now).
WINDOWS: Mapping[str, float] = {"azure_preempt_s": 30.0}

SOURCES = ("azure.scheduled.preempt", "azure.scheduled.terminate", "azure.scheduled.maintenance")
STATUSES = ("Scheduled", "Started")
EVENT_SOURCES = ("Platform", "User")
_DESCRIPTION_MAX = 120


@dataclass(frozen=True)
class _Rule:
    source: str
    kind: NoticeKind
    response: Response
    window: str = ""  # the deadline of a Scheduled event without NotBefore ("": receipt)


# EventType -> rule, or the reason it is no notice.
TYPES: Mapping[str, _Rule | str] = MappingProxyType(
    {
        "Preempt": _Rule(SOURCES[0], NoticeKind.PREEMPTION, Response.FULL, "azure_preempt_s"),
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
        event_id=ident(event, "EventId", EVENT_ID, at=at),
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
    vm_name = ident(envelope, "vm_name", VM_RESOURCE_NAME)
    node_name = opt_ident(envelope, "node_name", ids.K8S_NAME)
    raw_id = opt_text(envelope, "resource_id")
    vm = AzureVm("", "", vm_name)
    pid = ""
    if raw_id:
        vm = resource_id(raw_id.strip(), "resource_id")
        if vm.name.lower() != vm_name.lower():
            raise ParseError(f"resource_id: names VM {show(vm.name)}, not {show(vm_name)}")
        pid = vm.provider_id
    priority = opt_text(envelope, "priority")
    if priority:
        _choice(priority, PRIORITIES, "priority")
    location = opt_ident(envelope, "location", LOCATION)
    facts = {
        **Placement(
            region=location,
            zone=opt_ident(envelope, "zone", ZONE),
            instance_type=opt_ident(envelope, "vm_size", VM_SIZE),
        ).attributes(),
        **AzureVmFacts(**vm.facts(), priority=priority).attributes(),
    }
    target = Target(instance_id=vm_name, provider_id=pid, node_name=node_name)
    return _Node(vm_name, target, facts)


def _notice(
    event: _Event,
    rule: _Rule,
    node: _Node,
    *,
    received_at: datetime,
    windows: Windows,
    payload: bytes,
) -> Notice:
    scheduled = event.status == "Scheduled"
    if scheduled and event.not_before:
        deadline = event.not_before
    elif scheduled and rule.window:
        deadline = plus(received_at, windows.of(rule.window, WINDOWS))
    else:
        deadline = received_at
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
                **AzureEventFacts(
                    event_id=event.event_id,
                    event_type=event.event_type,
                    event_status=event.status,
                    event_source=event.source,
                    not_before=rfc3339(event.not_before) if event.not_before else "",
                    duration_s=event.duration_s,
                    description=event.description,
                    resources=str(len(event.resources)),
                    approvable="true" if approvable else "",
                ).attributes(),
            }
        ),
        payload_digest=digest(payload),
    )


def _events(body: Any, at: str) -> list[_Event]:
    """The document's events, read and checked (an object, or its text)."""
    document = as_object(load(body) if isinstance(body, str) else body, at)
    _int(member(document, "DocumentIncarnation", at=at), f"{at}.DocumentIncarnation")
    return [
        _event(raw, f"{at}.Events[{i}]") for i, raw in enumerate(items(document, "Events", at=at))
    ]


def _outcome(
    events: list[_Event], node: _Node, *, received_at: datetime, windows: Windows, payload: bytes
) -> ParseOutcome:
    """The notices the events make for this VM, else why there are none."""
    notices: list[Notice] = []
    reasons: list[str] = []
    for event in events:
        if node.vm_name.lower() not in event.names():
            continue
        rule = TYPES[event.event_type]
        if isinstance(rule, str):
            reasons.append(f"{event.event_type} {event.event_id}: {rule}")
            continue
        notices.append(
            _notice(event, rule, node, received_at=received_at, windows=windows, payload=payload)
        )
    if notices:
        return tuple(notices)
    if reasons:
        return Ignored("; ".join(reasons))
    if events:
        return Ignored(f"{len(events)} event(s), none for {node.vm_name}")
    return Ignored("no scheduled events")


def parse(payload: bytes, *, received_at: datetime, windows: Windows) -> ParseOutcome:
    """A Scheduled Events document in the poller's envelope (see the module docstring)."""
    envelope = as_object(load(payload), "scheduled events envelope")
    node = _node(envelope)
    events = _events(member(envelope, "document"), "document")
    return _outcome(events, node, received_at=received_at, windows=windows, payload=payload)


def parse_saved(
    payload: bytes, *, received_at: datetime, windows: Windows, target: str = ""
) -> ParseOutcome:
    """What ``reclaimd parse`` reads: the poller's envelope, or the bare document as IMDS
    returns it (``curl -H Metadata:true .../metadata/scheduledevents?api-version=2020-07-01``
    saved to a file), for the VM ``target`` names or, without it, every VM an event names.

    A bare document does not say which VM read it, so a VM it names is read as the poller on
    that VM would (its name is its target; no resource ID, node or size). A name that is no
    Azure VM name is skipped (another VM's, as the poller compares it and never uses it).
    """
    raw = as_object(load(payload), "scheduled events document")
    if "document" in raw or "vm_name" in raw:  # the poller's envelope
        node = _node(raw)
        if target and target.lower() != node.vm_name.lower():
            raise ParseError(f"vm: {show(target)} is not the envelope's VM, {show(node.vm_name)}")
        return parse(payload, received_at=received_at, windows=windows)
    events = _events(raw, "document")
    if target:
        node = _node({"vm_name": VM_RESOURCE_NAME.check(target, "vm")})
        return _outcome(events, node, received_at=received_at, windows=windows, payload=payload)
    named = {r.lower(): r for event in events for r in event.resources}  # first spelling kept
    notices: list[Notice] = []
    reasons: list[str] = []
    for name in named.values():
        try:
            node = _node({"vm_name": name})
        except ParseError as e:
            reasons.append(f"{name}: skipped ({e})")
            continue
        outcome = _outcome(events, node, received_at=received_at, windows=windows, payload=payload)
        if isinstance(outcome, Ignored):
            reasons.append(f"{name}: {outcome.reason}")
        else:
            notices.extend(outcome)
    if notices:
        return tuple(notices)
    if reasons:
        return Ignored("; ".join(reasons))
    if events:
        return Ignored(f"{len(events)} event(s), none naming a VM")
    return Ignored("no scheduled events")
