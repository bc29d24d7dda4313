"""Targets for cloud instances, built the way each cloud names its Kubernetes nodes.

The cluster cache resolves a target by whichever field it indexes, so a parser fills every
field its payload determines and leaves the rest empty rather than guessing: an EC2
``providerID`` needs the availability zone, which not every EC2 event carries.
"""

from __future__ import annotations

import re

from reclaimd.model import Target

# us-east-2a, us-west-2-lax-1a: a region's name followed by a zone letter.
_AWS_ZONE = re.compile(r"[a-z]{2}(?:-[a-z0-9]+)*-[0-9]+[a-z]")
_GCE_ZONE = re.compile(r"[a-z]+-[a-z]+[0-9]+-[a-z]")
_NAME = re.compile(r"[^/\s]+")  # anything that can sit between the slashes of a provider ID


def is_aws_zone(value: str, region: str = "") -> bool:
    """Whether ``value`` names an availability zone (of ``region``, when it is known).

    With the region known, any longer name that starts with it is a zone of it, which also
    covers Wavelength zones (``us-east-1-wl1-bos-wlz-1``); without it, only the common
    ``<region><letter>`` shape is recognised.
    """
    if region:
        return value.startswith(region) and len(value) > len(region) and is_name(value)
    return _AWS_ZONE.fullmatch(value) is not None


def is_name(value: str) -> bool:
    """Whether ``value`` can be one segment of a provider ID."""
    return _NAME.fullmatch(value) is not None


def aws_instance(instance_id: str, *, zone: str = "", node_name: str = "") -> Target:
    """An EC2 instance; ``provider_id`` is the cloud provider's ``aws:///<zone>/<id>``."""
    provider_id = f"aws:///{zone}/{instance_id}" if zone else ""
    return Target(instance_id=instance_id, provider_id=provider_id, node_name=node_name)


def gce_instance(project: str, zone: str, name: str) -> Target:
    """A GCE VM: GKE names the node after the instance, ``providerID`` is ``gce://p/z/name``.

    The numeric GCE instance id is not ``Target.instance_id``: node provider IDs on GCE carry
    the name, so nothing in the cluster indexes the number. Parsers keep it as an attribute.
    """
    return Target(provider_id=f"gce://{project}/{zone}/{name}", node_name=name)


def gce_region(zone: str) -> str:
    """``us-central1-a`` -> ``us-central1``; ``""`` for anything not shaped like a zone."""
    return zone.rsplit("-", 1)[0] if _GCE_ZONE.fullmatch(zone) else ""
