"""Identifier grammars: every id a parser takes from a payload is checked against its provider's.

An identifier ends up in a Kubernetes field selector, a provider ID, a claim's object name, a
log line and a Kafka event, so a payload that could put ``../``, a newline, a second selector
term or a 10 MB string there must fail in the parser, as a one-line ``ParseError`` (acked and
counted), rather than reach the cluster. The grammars are the providers' own:

- EC2 instance ids: ``i-`` + 8 or 17 lowercase hex digits;
- AWS regions (``us-east-2``, ``us-gov-west-1``) and availability zones (a region + a letter,
  or a Local / Wavelength zone: ``us-west-2-lax-1a``, ``us-east-1-wl1-bos-wlz-1``);
- AWS account ids: 12 digits; Auto Scaling group names: 1-255 characters, no control
  characters; lifecycle hook names: 1-255 of ``[A-Za-z0-9_/-]``; lifecycle action tokens: a
  UUID;
- Kubernetes object names (nodes, pods, Workloads, queues): DNS-1123 subdomains (<= 253);
  namespaces: DNS-1123 labels (<= 63); uids: at most 128 of ``[A-Za-z0-9._-]``;
- GCE instance names: RFC 1035 labels (<= 63); numeric instance ids: decimal, fit a uint64;
  zones (``us-central1-a``) and regions (``us-central1``);
- GCP project ids: 6-30 of ``[a-z0-9-]``, a letter first, no trailing hyphen. (The legacy
  domain-scoped ``example.com:project`` form is not accepted: none of the payloads reclaimd
  reads has been seen to carry one.)
- generic notices (the Kafka topic): provider IDs (a scheme, then plain name segments: no
  ``..``, no query), instance ids of either cloud, CloudEvents sources (printable ASCII) and
  W3C ``traceparent`` values; EC2 instance types (``p5.48xlarge``) in the IMDS envelope.
- Azure VM resource IDs, either shape, and a node's ``azure://`` providerID: the shape here
  (``AZURE_VM_ID``), each part's grammar in the Azure handler (``azure_scheduled.py``);
  ``azure_instance`` is the registry's providerID -> VM name mapping for Azure nodes.

Every grammar checks the length before it runs its pattern: a 10 MB identifier is refused
by one comparison, and no pattern ever sees more than a few hundred characters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from reclaimd.model import ParseError

_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
_AWS_REGION = r"[a-z]{2}(?:-[a-z]+)+-[0-9]{1,2}"
_UINT64_MAX = 2**64 - 1


@dataclass(frozen=True)
class Grammar:
    """One provider's identifier: a full-match pattern and a length bound."""

    what: str  # "an EC2 instance id": what the error says the value is not
    pattern: re.Pattern[str]
    max_len: int

    def matches(self, value: str) -> bool:
        return len(value) <= self.max_len and self.pattern.fullmatch(value) is not None

    def check(self, value: str, name: str) -> str:
        """``value`` unchanged, or a one-line ``ParseError`` naming the field."""
        if not self.matches(value):
            raise ParseError(f"{name}: not {self.what}: {_show(value)}")
        return value


def _show(value: str) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _grammar(what: str, pattern: str, max_len: int) -> Grammar:
    # re.ASCII: \d and friends must not match other scripts' digits; no pattern below relies
    # on them, but a later edit might.
    return Grammar(what, re.compile(pattern, re.ASCII), max_len)


EC2_INSTANCE_ID = _grammar("an EC2 instance id", r"i-(?:[0-9a-f]{8}|[0-9a-f]{17})", 19)
AWS_REGION = _grammar("an AWS region", _AWS_REGION, 32)
AWS_ZONE = _grammar("an AWS availability zone", rf"{_AWS_REGION}(?:[a-z]|(?:-[a-z0-9]+)+)", 64)
# p5.48xlarge, u-6tb1.metal, mac2-m2pro.metal: a family and a size.
EC2_INSTANCE_TYPE = _grammar("an EC2 instance type", r"[a-z0-9-]+\.[a-z0-9-]+", 64)
AWS_ACCOUNT = _grammar("an AWS account id", r"[0-9]{12}", 12)
# AWS allows any XML character; control characters (newlines in a log line) are refused.
ASG_NAME = _grammar("an Auto Scaling group name", r"[^\x00-\x1f\x7f]+", 255)
LIFECYCLE_HOOK_NAME = _grammar("a lifecycle hook name", r"[A-Za-z0-9_/-]+", 255)
LIFECYCLE_TOKEN = _grammar(
    "a lifecycle action token", r"[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}", 36
)
K8S_NAME = _grammar("a Kubernetes name (DNS-1123 subdomain)", rf"{_LABEL}(?:\.{_LABEL})*", 253)
K8S_NAMESPACE = _grammar("a Kubernetes namespace (DNS-1123 label)", _LABEL, 63)
K8S_UID = _grammar("a Kubernetes uid", r"[A-Za-z0-9._-]+", 128)
GCE_NAME = _grammar("a GCE instance name (RFC 1035 label)", r"[a-z](?:[-a-z0-9]*[a-z0-9])?", 63)
GCE_ZONE = _grammar("a GCE zone", r"[a-z]+-[a-z]+[0-9]+-[a-z]", 40)
GCE_REGION = _grammar("a GCE region", r"[a-z]+-[a-z]+[0-9]+", 40)
GCP_PROJECT = _grammar("a GCP project id", r"[a-z][a-z0-9-]{4,28}[a-z0-9]", 30)
_GCE_ID = _grammar("a GCE instance id", r"[0-9]{1,20}", 20)
# aws:///us-east-2a/i-0abc, gce://project/zone/name, kwok://node: a scheme and segments
# that are each a plain name (no "..", no whitespace, no query or fragment).
_SEGMENT = r"[A-Za-z0-9_:@-][A-Za-z0-9._:@-]*"
PROVIDER_ID = _grammar(
    "a provider ID", rf"[a-z][a-z0-9+.-]*://(?:/?{_SEGMENT}(?:/{_SEGMENT})*)?", 512
)


# Target.instance_id of a generic notice: whatever a node's providerID ends in.
CLOUD_INSTANCE = _grammar(
    "an instance id (EC2 id, GCE instance name or GCE numeric id)",
    r"i-(?:[0-9a-f]{8}|[0-9a-f]{17})|[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?|[0-9]{1,20}",
    63,
)
# A CloudEvents source is a URI reference; printable ASCII keeps it one line in logs.
CLOUDEVENT_SOURCE = _grammar("a CloudEvents source", r"[!-~]+", 256)
TRACEPARENT = _grammar(
    "a W3C traceparent", r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}", 55
)

# An Azure VM's ARM resource ID, either shape (ARM matches segment names case-insensitively):
# a Uniform scale-set instance (AKS node pools) or a plain, availability-set or Flexible VM.
# The handler checks each part against its grammar; the providerID mapping needs the shape.
# Not a ``Grammar``: a shape with named parts. The handler bounds a payload's id before
# matching it; ``azure_instance`` reads a node's providerID, not a payload.
AZURE_VM_ID = re.compile(
    r"/subscriptions/(?P<sub>[^/]+)/resourceGroups/(?P<rg>[^/]+)"
    r"/providers/Microsoft\.Compute/"
    r"(?:virtualMachineScaleSets/(?P<vmss>[^/]+)/virtualMachines/(?P<n>[^/]+)"
    r"|virtualMachines/(?P<vm>[^/]+))",
    re.ASCII | re.IGNORECASE,
)
AZURE_PROVIDER_PREFIX = "azure://"


def gce_instance_id(value: str, name: str) -> str:
    """A numeric GCE instance id: decimal digits that fit an unsigned 64-bit integer."""
    _GCE_ID.check(value, name)
    if int(value) > _UINT64_MAX:
        raise ParseError(f"{name}: not a GCE instance id (over 2^64-1): {_show(value)}")
    return value


def aws_zone(value: str, name: str, region: str = "") -> str:
    """An availability zone, of ``region`` when that is known."""
    AWS_ZONE.check(value, name)
    if region and not value.startswith(region):
        raise ParseError(f"{name}: zone {_show(value)} is not in region {_show(region)}")
    return value


def azure_instance(provider_id: str) -> str | None:
    """An AKS node's ``azure://`` providerID -> its VM name as IMDS and Scheduled Events show
    it (``<vmss>_<n>`` in a Uniform scale set); "" for one of no VM shape; None for another
    cloud's."""
    if not provider_id.startswith(AZURE_PROVIDER_PREFIX):
        return None
    match = AZURE_VM_ID.fullmatch(provider_id.removeprefix(AZURE_PROVIDER_PREFIX))
    if match is None:
        return ""
    return match["vm"] or f"{match['vmss']}_{match['n']}"
