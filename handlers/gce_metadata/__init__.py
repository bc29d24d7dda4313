"""The gce_metadata source: a per-node watcher of the GCE metadata server's preempted and
maintenance-event keys.

Its folder holds all of it: ``parser`` (pure: payload bytes -> notices), ``settings`` (its
section of ``Settings``), ``transport`` (imported only when it is enabled: its client library
with it). ``ENTRY`` is what the registry (``reclaimd.handlers``) reads.
"""

from __future__ import annotations

from reclaimd.handlers.entry import Entry, Origin
from reclaimd.handlers.gce_metadata import parser
from reclaimd.handlers.gce_metadata.settings import GceMetadataSettings

ENTRY = Entry(
    "gce_metadata", GceMetadataSettings,
    Origin("gcp.metadata.", "gcp", "gcp_compute_engine", transport="gce_metadata"),
    parse=parser.parse, parse_saved=parser.parse_saved, windows=parser.WINDOWS,
    agent="gce-metadata", agent_node_name=True,
    aliases=("gce-metadata",),
    order=4,
)  # fmt: skip
