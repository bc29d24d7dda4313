"""Kubernetes Events on nodes and pods (``reclaimd.cluster.events``)."""

from __future__ import annotations

from pydantic import Field

from reclaimd.strict import Strict


class EventSettings(Strict):
    """Kubernetes Events on nodes and pods (``kubectl get events --field-selector
    reason=Interrupted``): best effort, last in the write budget, dropped rather than late."""

    enabled: bool = True
    """Off: no recorder is built (the wiring's choice; the recorder never reads it)."""

    queue_size: int = Field(1024, ge=1, le=1_000_000)
    """Events waiting for the write budget at most; more are dropped (a storm of 500 nodes
    with 8 pods each and 6 reasons is ~25k events: no one reads them all, and each would be
    a write the storm needs)."""

    max_age_s: float = Field(60.0, gt=0)
    """An event that waited this long is dropped: by then it tells a story already over."""

    series_window_s: float = Field(360.0, gt=0)
    """A repeat within this window joins the first event's series (client-go: 6 minutes)."""

    series_flush_s: float = Field(30.0, gt=0)
    """A series is patched at most this often, however often it repeats."""

    series_cache: int = Field(4096, ge=1, le=1_000_000)
    """Distinct events remembered for series; the oldest is forgotten first."""

    writers: int = Field(2, ge=1, le=64)
    """Events written at once."""
