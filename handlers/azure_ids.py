"""Azure identifiers: VM and scale-set instance names, resource IDs, ``azure://`` provider IDs.

Kept apart from ``ids.py`` so the registry refactor can adopt it whole (one place maps an
Azure node's providerID to its instance); the grammars are ``ids.Grammar``s like the rest.

- subscription ids: a GUID;
- resource group names: 1-90 of ``[-\\w.()]``, not ending in ``.`` (Azure also allows
  non-ASCII letters; refused here, as ``ids.py`` refuses other scripts: an id goes into a field
  selector and a log line);
- VM and scale-set names: 1-64 of ``[A-Za-z0-9.-]``, starting and ending alphanumeric (Linux
  VM rules; no ``_``, which Azure refuses in both);
- a scale-set instance's VM name (what IMDS ``compute.name`` and Scheduled Events
  ``Resources`` show): ``<scale set>_<instance>``, the instance a decimal id (Uniform) or an
  8-character hex suffix (Flexible);
- Scheduled Events ``EventId``: documented as a GUID; any 1-64 of ``[A-Za-z0-9-]`` is taken,
  so a differently shaped id from the platform does not cost a Spot notice.

Resource and provider IDs have two VM shapes (ARM segment names match case-insensitively, as
ARM does):

- ``/subscriptions/<sub>/resourceGroups/<rg>/providers/Microsoft.Compute/`` +
  ``virtualMachineScaleSets/<vmss>/virtualMachines/<n>`` (a Uniform scale-set instance: AKS
  node pools),
- the same prefix + ``virtualMachines/<name>`` (a standalone or availability-set VM, and a
  Flexible scale-set instance).

A node's providerID is ``azure://`` + that resource ID, with the resource group lowercased:
cloud-provider-azure writes it so "for historical reasons", and the IMDS ``resourceId`` keeps
the group's case (``MC_rg_cluster_region``), so ``AzureVm.provider_id`` lowercases it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from reclaimd.model import ParseError

from .ids import Grammar


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

_ID = re.compile(
    r"/subscriptions/(?P<sub>[^/]+)/resourceGroups/(?P<rg>[^/]+)"
    r"/providers/Microsoft\.Compute/"
    r"(?:virtualMachineScaleSets/(?P<vmss>[^/]+)/virtualMachines/(?P<n>[^/]+)"
    r"|virtualMachines/(?P<vm>[^/]+))",
    re.ASCII | re.IGNORECASE,
)
_MAX_ID = 512
PROVIDER_PREFIX = "azure://"


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
