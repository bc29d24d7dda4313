"""The imds source's settings: the per-node poller of EC2 instance metadata."""

from __future__ import annotations

from pydantic import Field

from reclaimd.handlers.entry import SourceSettings, unless_url


class ImdsSettings(SourceSettings):
    url: str = "http://169.254.169.254"
    poll_interval_s: float = Field(2.0, gt=0)
    token_ttl_s: int = Field(21600, ge=1, le=21600)

    def needs(self) -> dict[str, str]:
        return unless_url("url", self.url, "IMDS, http://169.254.169.254")
