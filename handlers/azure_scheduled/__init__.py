"""The azure_scheduled source: a per-node poller of Azure Scheduled Events (AKS Spot pools), which
approves an event once its notice's gangs are drained.

Its folder holds all of it: ``parser`` (pure: payload bytes -> notices), ``settings`` (its
section of ``Settings``), ``transport`` (imported only when it is enabled: its client library
with it). ``ENTRY`` is what the registry (``reclaimd.handlers``) reads.
"""

from __future__ import annotations

from reclaimd.handlers.azure_scheduled import parser
from reclaimd.handlers.azure_scheduled.settings import AzureScheduledSettings
from reclaimd.handlers.entry import Entry, Origin
from reclaimd.handlers.ids import azure_instance

ENTRY = Entry(
    "azure_scheduled", AzureScheduledSettings,
    Origin("azure.scheduled.", "azure", "azure_vm", transport="azure_scheduled"),
    parse=parser.parse, parse_saved=parser.parse_saved, windows=parser.WINDOWS,
    after_drain="transport", agent="azure-scheduled", agent_node_name=True,
    facts=(parser.AzureVmFacts, parser.AzureEventFacts), instance_of=azure_instance,
    aliases=("azure-scheduled",),
    order=5,
)  # fmt: skip
