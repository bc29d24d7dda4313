"""The gce_metadata source's settings: the per-node watcher of the GCE metadata server."""

from __future__ import annotations

from pydantic import Field

from reclaimd.handlers.entry import SourceSettings, unless_url


class GceMetadataSettings(SourceSettings):
    """Per-node mode on GCE: the metadata server's preempted and maintenance-event keys."""

    url: str = "http://metadata.google.internal"
    node_name: str = ""  # this node, from the downward API (spec.nodeName)
    timeout_s: float = Field(60.0, gt=0)  # wait_for_change hanging GET

    def needs(self) -> dict[str, str]:
        return unless_url("url", self.url, "the metadata server, http://metadata.google.internal")
