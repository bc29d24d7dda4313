"""The allocation meter (``reclaimd.meter``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from reclaimd.strict import Strict


class AllocationSettings(Strict):
    """The allocation meter: GPU-, MIG- and HBM-hours per hour and instance, by cost label,
    for ``reclaimd report``. One replica meters each hour (an hourly Lease)."""

    enabled: bool = False
    topic: str = "reclaimd.allocation"  # a sibling of the ledger topic, same broker
    # None: next to the ledger's outbox (``<outbox>-allocation.sqlite``).
    outbox_path: Path | None = None
    interval_s: float = Field(30.0, gt=0)
    """The fleet is read and metered this often."""

    open_every_s: float = Field(300.0, gt=0)
    """The open hour's running total is written this often (replaced when the hour closes)."""
