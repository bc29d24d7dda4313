"""Targets for cloud instances, built the way each cloud names its Kubernetes nodes.

The cluster cache resolves a target by whichever field it indexes, so a parser fills every
field its payload determines and leaves the rest empty rather than guessing: an EC2
``providerID`` needs the availability zone, which not every EC2 event carries.
"""

from __future__ import annotations

from reclaimd.handlers.ids import AWS_ZONE, GCE_ZONE
from reclaimd.model import Placement, Target


def is_aws_zone(value: str, region: str = "") -> bool:
    """Whether ``value`` names an availability zone (of ``region``, when it is known).

    The zone grammar covers Local and Wavelength zones (``us-east-1-wl1-bos-wlz-1``); a
    known region must be the zone's prefix.
    """
    return AWS_ZONE.matches(value) and (not region or value.startswith(region))


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
    return zone.rsplit("-", 1)[0] if GCE_ZONE.matches(zone) else ""


def ec2_arn(where: Placement, instance_id: str) -> str:
    """An EC2 instance's ARN, when the event named all of its parts (the ``cloud.resource_id``
    of the AWS sources' origins)."""
    if instance_id and where.region and where.account:
        return f"arn:aws:ec2:{where.region}:{where.account}:instance/{instance_id}"
    return ""
