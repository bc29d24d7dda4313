"""The kueue source: Kueue Workloads evicted by preemption, as a Kubernetes watch sees them.

Its folder holds all of it: ``parser`` (pure: payload bytes -> notices), ``settings`` (its
section of ``Settings``), ``transport`` (imported only when it is enabled: its client library
with it). ``ENTRY`` is what the registry (``reclaimd.handlers``) reads.
"""

from __future__ import annotations

from reclaimd.handlers.entry import Entry, Origin
from reclaimd.handlers.kueue import parser
from reclaimd.handlers.kueue.settings import KueueSettings

ENTRY = Entry(
    "kueue", KueueSettings,
    Origin("kueue.", transport="kubernetes_watch"),
    parse=parser.parse, windows=parser.WINDOWS,
    order=6,
)  # fmt: skip
