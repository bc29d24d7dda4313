"""Reading the API server's objects as it sends them: JSON maps, camelCase, any part absent.

Every read of a Node, Pod or Lease goes through these few functions, so a missing
``metadata`` or ``spec`` is ``{}`` (never a ``KeyError`` in the middle of a runbook).
"""

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

Obj = Mapping[str, Any]


def part(obj: Obj, key: str) -> Obj:
    """``obj[key]`` when it is a map, else {}."""
    found = obj.get(key)
    return found if isinstance(found, Mapping) else {}


def meta(obj: Obj) -> Obj:
    return part(obj, "metadata")


def spec(obj: Obj) -> Obj:
    return part(obj, "spec")


def name(obj: Obj) -> str:
    return str(meta(obj).get("name") or "")


def uid(obj: Obj) -> str:
    return str(meta(obj).get("uid") or "")


def version(obj: Obj) -> str:
    """``metadata.resourceVersion``: what a precondition names."""
    return str(meta(obj).get("resourceVersion") or "")


def annotations(obj: Obj) -> dict[str, str]:
    return {str(k): str(v) for k, v in part(meta(obj), "annotations").items()}


def items(listed: Obj) -> list[Obj]:
    """A list's objects."""
    return [o for o in listed.get("items") or () if isinstance(o, Mapping)]


def time(value: Any) -> datetime | None:
    """A Time or MicroTime field (RFC 3339, ``Z``) as an aware datetime; None when absent or
    unreadable."""
    if not value:
        return None
    try:
        at = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)
