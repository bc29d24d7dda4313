"""The kueue source's settings: the Workload watch."""

from __future__ import annotations

from reclaimd.handlers.entry import SourceSettings


class KueueSettings(SourceSettings):
    """Kueue Workloads whose eviction by preemption is a reclaim notice."""

    namespaces: tuple[str, ...] = ()  # empty: every namespace
