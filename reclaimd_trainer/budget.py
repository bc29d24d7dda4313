"""A rank's share of its tenant's PutObject budget, as it travels with reclaimd's requests.

reclaimd splits each tenant's PutObject budget among the ranks it is waiting for (its
``reclaimd.putbudget`` allocator) and hands each rank its share: ``put_budget: {"qps": <float>,
"burst": <int>}`` in the request body, ``X-Reclaimd-Put-Budget: qps=<float>;burst=<int>`` on
every status poll (docs/checkpoint-contract.md). This is the value and its two wire forms; both
sides read them from here. Absent means "the pod's own guard limit".
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

HEADER: Final = "X-Reclaimd-Put-Budget"
REQUEST_FIELD: Final = "put_budget"
DEFAULT_QPS: Final = 20.0  # the security floor's maxPutObjectQpsPerSa
MILLI: Final = 1000  # rates are handed out in milli-PutObject/s
MAX_QPS: Final = 1_000_000.0
MAX_BURST: Final = 1_000_000
_HEADER_ITEM = re.compile(r"\s*([a-z]+)\s*=\s*([^;]*?)\s*")


# --- the share and its wire format --------------------------------------------------------


@dataclass(frozen=True)
class Share:
    """One rank's part of its tenant's budget: PutObject/s and bucket size. 0 = wait."""

    qps: float
    burst: int

    def __post_init__(self) -> None:
        if not (math.isfinite(self.qps) and 0.0 <= self.qps <= MAX_QPS):
            raise ValueError(f"put budget qps must be a number in [0, {MAX_QPS:g}]")
        if isinstance(self.burst, bool) or not 0 <= self.burst <= MAX_BURST:
            raise ValueError(f"put budget burst must be an integer in [0, {MAX_BURST}]")

    @classmethod
    def of_milli(cls, qps_milli: int, burst: int) -> Share:
        return cls(qps_milli / MILLI, burst)

    @property
    def waits(self) -> bool:
        """Nothing may be sent on this share (until it is raised)."""
        return self.qps <= 0.0 or self.burst <= 0

    def to_json(self) -> dict[str, float | int]:
        """The request body's ``put_budget`` value."""
        return {"qps": self.qps, "burst": self.burst}

    def header_value(self) -> str:
        """The ``X-Reclaimd-Put-Budget`` value: ``qps=<float>;burst=<int>``."""
        return f"qps={self.qps!r};burst={self.burst}"


def parse_field(doc: Mapping[str, Any]) -> Share | None:
    """A request body's ``put_budget``; ``None`` when absent. ``ValueError`` with one line."""
    raw = doc.get(REQUEST_FIELD)
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValueError(f"{REQUEST_FIELD} is not an object")
    qps, burst = raw.get("qps"), raw.get("burst")
    if isinstance(qps, bool) or not isinstance(qps, int | float):
        raise ValueError(f"{REQUEST_FIELD}.qps is not a number")
    if isinstance(burst, bool) or not isinstance(burst, int):
        raise ValueError(f"{REQUEST_FIELD}.burst is not an integer")
    return Share(float(qps), burst)


def parse_header(value: str | None) -> Share | None:
    """An ``X-Reclaimd-Put-Budget`` value; ``None`` when absent. Unknown keys are ignored (room
    to grow); ``qps`` and ``burst`` are required. ``ValueError`` with one line otherwise."""
    if value is None:
        return None
    if len(value) > 200:
        raise ValueError(f"{HEADER} is longer than 200 characters")
    items: dict[str, str] = {}
    for part in value.split(";"):
        if not part.strip():
            continue
        m = _HEADER_ITEM.fullmatch(part)
        if m is None:
            raise ValueError(f"{HEADER}: {part.strip()[:40]!r} is not key=value")
        if m[1] in items:
            raise ValueError(f"{HEADER}: {m[1]} given twice")
        items[m[1]] = m[2]
    try:
        qps = float(items["qps"])
        burst = int(items["burst"])
    except KeyError as e:
        raise ValueError(f"{HEADER}: {e.args[0]} is missing") from None
    except ValueError:
        raise ValueError(f"{HEADER}: qps must be a number and burst an integer") from None
    return Share(qps, burst)
