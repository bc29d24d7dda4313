"""The peers' death detector (``reclaimd.cluster.probe``)."""

from __future__ import annotations

from pydantic import Field

from reclaimd.strict import Strict


class PeerProbeSettings(Strict):
    """The peers' death detector (``cluster.probe``): each replica listens on ``host:port``
    and names that address in its holder Lease; the others connect to it every ``every_s``.
    Refused = dead now (its claims are taken over at once); anything else waits for
    ``claim_stale_s``. A replica taking a notice over also asks its holder there for the
    acks it could not record, for up to ``ask_s``. The chart opens the port to the other
    replicas only."""

    enabled: bool = True
    host: str = ""  # where to listen; empty: every interface
    port: int = Field(0, ge=0, le=65535)  # 0: any free one (the chart fixes 9465)
    # The address peers dial; empty: $POD_IP (the chart sets it), else 127.0.0.1.
    advertise: str = ""
    every_s: float = Field(0.5, gt=0, le=60)
    timeout_s: float = Field(0.5, gt=0, le=60)
    ask_s: float = Field(1.0, gt=0, le=60)
