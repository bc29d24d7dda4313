"""What the cluster cache watches and how (``reclaimd.cluster.cache``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from reclaimd.settings.watch import WatchSettings
from reclaimd.strict import Strict


class CacheSettings(Strict):
    """What the cluster cache watches and how (``CacheSettings``)."""

    namespaces: tuple[str, ...] = ()
    """Namespaces whose pods and Workloads are watched; empty means the whole cluster."""

    watch_workloads: bool = True
    watch_pdbs: bool = True
    """Watch PodDisruptionBudgets, so an eviction a PDB refused is tried again when the PDB
    changes (``pdbs``); without, on a timer."""

    permanent_error_pause_s: float = Field(30.0, gt=0)
    """After a non-retriable watch failure (RBAC, CRD missing), wait this long before trying
    again: a fixed RBAC or a newly installed CRD is picked up without a restart."""

    stall_after_s: float = Field(150.0, gt=0)
    """A stream with no LIST, event or BOOKMARK for this long is stuck (the server bookmarks
    an idle watch every minute and the watch reconnects after its own inactivity timeout):
    the supervisor restarts it."""

    supervise_interval_s: float = Field(2.0, gt=0)
    """How often the supervisor looks for stuck streams (and writes the pods' snapshot)."""

    snapshot_path: Path | None = None
    """Where the pods are kept on the replica's disk for its next process (``podsnapshot``:
    a pod deleted while no replica ran is still charged); written at most every
    ``supervise_interval_s``, when they changed. None in the file: next to the ledger's
    outbox, ``pods.snapshot`` (the wiring places it); None in the cache: nowhere."""

    watch: WatchSettings = WatchSettings()
