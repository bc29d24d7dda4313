"""The pubsub source: GCE preemption and host-maintenance audit entries, as a Cloud Logging sink
publishes them to Pub/Sub; one subscription per slot, a slot per replica.

Its folder holds all of it: ``parser`` (pure: payload bytes -> notices), ``settings`` (its
section of ``Settings``), ``transport`` (imported only when it is enabled: its client library
with it). Its slot Leases are written by ``reclaimd.cluster.slots``, not here: ``reclaimd
status`` and the rig's teardown read that record too. ``ENTRY`` is what the registry
(``reclaimd.handlers``) reads.
"""

from __future__ import annotations

from reclaimd.handlers.entry import Entry, Origin
from reclaimd.handlers.pubsub import parser
from reclaimd.handlers.pubsub.settings import PubSubSettings

ENTRY = Entry(
    "pubsub", PubSubSettings,
    Origin(
        "gcp.", "gcp", "gcp_compute_engine", messaging="gcp_pubsub",  # Logging sink
        destination_key="messaging.destination.subscription.name",
    ),
    parse=parser.parse, windows=parser.WINDOWS,
    slotted=True,
    aliases=("gke",),
    order=3,
)  # fmt: skip
