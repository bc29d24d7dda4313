"""GCE metadata-server notices, as the per-node watcher hands them over.

Payload: the watcher (a hanging GET with ``wait_for_change=true``) wraps each value it reads
in an envelope, because the plain-text value says nothing about the VM:

    {"instance": "gke-...-nr65", "project": "example-project", "zone": "us-central1-a",
     "path": "instance/preempted", "value": "TRUE", "etag": "9d2f...",
     "observed_at": "2025-09-16T10:42:01Z"}

``instance``, ``project``, ``zone``, ``path`` and ``value`` are required; ``path`` is
relative to ``/computeMetadata/v1/`` (a full path or a query string is accepted too).
``observed_at`` is when the value was read (default: ``received_at``) and is both the
notice's ``issued_at`` and the start of its window.

Values: ``instance/preempted`` ``TRUE`` is a preemption (window ``gce_preemption_s``),
``FALSE`` is ``Ignored``. ``instance/maintenance-event`` ``TERMINATE_ON_HOST_MAINTENANCE``
is maintenance that stops the VM (window ``gce_maintenance_s``),
``MIGRATE_ON_HOST_MAINTENANCE`` a live migration (the VM stays: checkpoint only, as for the
audit-log event), ``NONE`` is ``Ignored``. Any other path or value is a ``ParseError``.

Identity: the metadata server has no message id; the id hashes the VM, the value and the
response ``ETag``. The watcher sees the same ETag on every read until the value changes, so
repeat reads map to one notice, and a second maintenance event on the same VM (value back
to ``NONE``, then set again: a new ETag) is a new one. Without an ``etag`` the id hashes the
content only, and such repeats collapse into the first notice.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType

from reclaimd.handlers import ids
from reclaimd.handlers.fields import (
    JSONObject,
    as_object,
    attributes,
    issued,
    load,
    opt_text,
    plus,
    show,
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

# Its windows (``Windows.of``): GCE's, which the Cloud Logging parser reads too.
WINDOWS: Mapping[str, float] = {"gce_preemption_s": 30.0, "gce_maintenance_s": 60.0}

_PREFIX = "computeMetadata/v1/"


@dataclass(frozen=True)
class _Rule:
    source: str
    kind: NoticeKind
    response: Response
    preemption: bool  # which window: preemption or maintenance
    maintenance: str = ""


# (path, value) -> rule, or the reason the value is no notice.
VALUES: Mapping[tuple[str, str], _Rule | str] = MappingProxyType(
    {
        ("instance/preempted", "TRUE"): _Rule(
            "gcp.metadata.preempted", NoticeKind.PREEMPTION, Response.FULL, preemption=True
        ),
        ("instance/preempted", "FALSE"): "instance is not preempted",
        ("instance/maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE"): _Rule(
            "gcp.metadata.maintenance",
            NoticeKind.MAINTENANCE,
            Response.FULL,
            preemption=False,
            maintenance="terminate",
        ),
        ("instance/maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE"): _Rule(
            "gcp.metadata.maintenance",
            NoticeKind.MAINTENANCE,
            Response.CHECKPOINT_ONLY,
            preemption=False,
            maintenance="migrate",
        ),
        ("instance/maintenance-event", "NONE"): "no host maintenance pending",
    }
)
PATHS = frozenset(path for path, _ in VALUES)


# project, zone and instance all go into a provider ID and a node lookup.
_GRAMMARS: Mapping[str, ids.Grammar] = MappingProxyType(
    {"project": ids.GCP_PROJECT, "zone": ids.GCE_ZONE, "instance": ids.GCE_NAME}
)


def _name(envelope: JSONObject, key: str) -> str:
    return _GRAMMARS[key].check(text(envelope, key).strip(), key)


def parse(payload: bytes, *, received_at: datetime, windows: Windows) -> ParseOutcome:
    """A metadata value in the watcher's envelope (see the module docstring)."""
    envelope = as_object(load(payload), "metadata envelope")
    path = text(envelope, "path").strip().partition("?")[0].lstrip("/").removeprefix(_PREFIX)
    if path not in PATHS:
        raise ParseError(f"path: not a metadata notice key: {show(path)}")
    value = text(envelope, "value").strip()
    rule = VALUES.get((path, value))
    if rule is None:
        raise ParseError(f"value: {show(value)} is not a value of {path}")
    project, zone, instance = (_name(envelope, k) for k in ("project", "zone", "instance"))
    if isinstance(rule, str):
        return Ignored(rule)
    observed = envelope.get("observed_at") is not None
    observed_at = (
        issued(time(envelope, "observed_at"), received_at, "observed_at")
        if observed
        else received_at
    )
    etag = opt_text(envelope, "etag")
    window = windows.of("gce_preemption_s" if rule.preemption else "gce_maintenance_s", WINDOWS)
    notice = Notice(
        id=stable_id(rule.source, project, zone, instance, value, etag),
        source=rule.source,
        kind=rule.kind,
        target=gce_instance(project, zone, instance),
        issued_at=observed_at,
        deadline=plus(observed_at, window),
        received_at=received_at,
        response=rule.response,
        attributes=attributes(
            {
                "project": project,
                "zone": zone,
                "region": gce_region(zone),
                "metadata_value": value,
                "maintenance": rule.maintenance,
            }
        ),
        payload_digest=digest(payload),
    )
    return (notice,)


def _vm(target: str) -> dict[str, str]:
    """``--vm``: ``<project>/<zone>/<instance>``, a ``gce://`` providerID or the
    ``projects/<p>/zones/<z>/instances/<i>`` path."""
    parts = [p for p in target.removeprefix("gce://").split("/") if p]
    if len(parts) == 6 and parts[0::2] == ["projects", "zones", "instances"]:
        parts = parts[1::2]
    if len(parts) != 3:
        raise ParseError(
            f"vm: {show(target)} is not <project>/<zone>/<instance>: give it so, or the node's"
            " providerID gce://<project>/<zone>/<instance>"
        )
    return dict(zip(("project", "zone", "instance"), parts, strict=True))


def parse_saved(
    payload: bytes, *, received_at: datetime, windows: Windows, target: str = ""
) -> ParseOutcome:
    """What ``reclaimd parse`` reads: the watcher's envelope, or a value as the metadata
    server returns it (``curl -H Metadata-Flavor:Google http://metadata.google.internal/
    computeMetadata/v1/instance/preempted > value.txt``: ``TRUE``,
    ``TERMINATE_ON_HOST_MAINTENANCE``, ...) for the VM ``target`` names (``--vm
    <project>/<zone>/<instance>``: a value does not say whose it is). Its key is told by the
    value: ``TRUE``/``FALSE`` are ``instance/preempted``'s, the rest
    ``instance/maintenance-event``'s."""
    value = payload.decode("utf-8", "replace").strip()
    if value.startswith("{"):  # the watcher's envelope
        envelope = as_object(load(payload), "metadata envelope")
        if target and _vm(target) != {k: str(envelope.get(k, "")) for k in _GRAMMARS}:
            raise ParseError(f"vm: {show(target)} is not the envelope's VM: leave --vm out")
        return parse(payload, received_at=received_at, windows=windows)
    paths = [path for path, known in VALUES if known == value]
    if not paths:
        known = ", ".join(sorted({v for _, v in VALUES}))
        raise ParseError(
            f"value: {show(value)} is no value of instance/preempted or"
            f" instance/maintenance-event ({known}): save the key's response as it came"
        )
    if not target:
        raise ParseError(
            "a metadata value does not name its VM: add --vm <project>/<zone>/<instance>"
            " (the node's providerID names them)"
        )
    envelope = {**_vm(target), "path": paths[0], "value": value}
    return parse(json.dumps(envelope).encode(), received_at=received_at, windows=windows)
