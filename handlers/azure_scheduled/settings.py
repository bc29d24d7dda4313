"""The azure_scheduled source's settings: the per-node poller of Azure Scheduled Events."""

from __future__ import annotations

from pydantic import Field

from reclaimd.handlers.entry import SourceSettings, unless_url


class AzureScheduledSettings(SourceSettings):
    """Per-node mode on Azure (AKS Spot pools): the metadata service's Scheduled Events."""

    url: str = "http://169.254.169.254"
    node_name: str = ""  # this node, from the downward API (spec.nodeName)
    # The docs recommend a poll a second; a Preempt gives at least 30 s.
    poll_interval_s: float = Field(1.0, gt=0)
    approve: bool = True  # POST StartRequests once a notice's gangs are drained

    def needs(self) -> dict[str, str]:
        return unless_url("url", self.url, "IMDS, http://169.254.169.254")
