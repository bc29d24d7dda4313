"""The peers' death detector (``reclaimd.cluster.probe``)."""

from __future__ import annotations

from pydantic import Field, model_validator

from reclaimd.strict import Strict


class PeerProbeSettings(Strict):
    """The peers' death detector (``cluster.probe``): each replica listens on ``host:port``
    and names that address in its holder Lease, renewed every ``renew_every_s``; the others
    connect to it every ``every_s``. Refused = dead now (its claims are taken over at once).
    Unanswered for ``silent_after_s`` while its Lease goes unrenewed as long = dead too (a
    stopped process, a dead node); a replica fences itself once its own renewals stop for
    that long. A replica taking a notice over also asks its holder there for the acks it
    could not record, for up to ``ask_s``. The chart opens the port to the other replicas
    only."""

    enabled: bool = True
    host: str = ""  # where to listen; empty: every interface
    port: int = Field(0, ge=0, le=65535)  # 0: any free one (the chart fixes 9465)
    # The address peers dial; empty: $POD_IP (the chart sets it), else 127.0.0.1.
    advertise: str = ""
    every_s: float = Field(0.5, gt=0, le=60)
    timeout_s: float = Field(0.5, gt=0, le=60)
    ask_s: float = Field(1.0, gt=0, le=60)
    # A third of silent_after_s or less: two renewals may be late before we fence ourselves.
    renew_every_s: float = Field(1.0, gt=0, le=60)
    # Shorter takes a stopped replica's claims over sooner; a live replica is never taken
    # over for it alone (its probe port answers from a thread of its own however busy its loop).
    silent_after_s: float = Field(3.0, gt=0, le=600)

    @model_validator(mode="after")
    def _renewals_fit_the_silence(self) -> PeerProbeSettings:
        if self.renew_every_s * 2 > self.silent_after_s:
            raise ValueError(
                "peer_probe.renew_every_s must be at most half of silent_after_s"
                f" ({self.renew_every_s:g} > {self.silent_after_s / 2:g})"
            )
        return self
