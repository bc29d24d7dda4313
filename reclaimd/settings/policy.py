"""What reclaimd does to a notice's pods and when: evictions against PDBs, the drain's
reserve and pace, notices for no known node or long expired. ``reclaimd.cluster.actions``
takes the model as it is; the runbook, the intake and the scheduler read their fields from
it in the wiring."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from reclaimd.strict import Strict


class EvictionPolicy(StrEnum):
    RESPECT_PDB = "respect-pdb"  # never break a PDB; report the gang as blocked
    FORCE_NEAR_DEADLINE = "force-near-deadline"  # delete with grace once the deadline is close


class UnknownTarget(StrEnum):
    DROP = "drop"  # count it and ack the message: the instance is not in this cluster
    RETRY = "retry"  # leave the message for redelivery (a node may still be registering)


class PolicySettings(Strict):
    eviction: EvictionPolicy = EvictionPolicy.FORCE_NEAR_DEADLINE

    force_before_s: float = Field(15.0, ge=0)
    """With force-near-deadline: stop honouring a PDB this long before the deadline, enough
    for the SIGTERM grace below plus the kubelet's reaction."""

    drain_when_saved: bool = True
    """A refused eviction of a saved gang's pod whose PDBs guard only that gang is deleted at
    once (``RELEASED``), not held until ``force_before_s``; false: the PDB holds it as any."""

    delete_grace_s: int = Field(5, ge=0)
    """Grace period of a forced delete: short, the node dies soon anyway."""

    drain_reserve_s: float = Field(30.0, ge=0)
    drain_reserve_fraction: float = Field(0.34, ge=0, le=0.9)
    """Time kept back from the checkpoint budget for the drain: min(s, fraction x window)."""

    unknown_target: UnknownTarget = UnknownTarget.DROP

    expired_after_s: float = Field(300.0, ge=0)
    """A notice whose deadline passed longer ago than this is acked and not acted on."""

    evict_concurrency: int = Field(32, ge=1)
    """Drain concurrency per notice; the client-side rate limiter bounds the total."""

    retry_base_s: float = Field(0.5, gt=0)
    retry_cap_s: float = Field(5.0, gt=0)
    """Backoff between evictions a PDB refused, and how often a drain looks for its pods
    again; the PDB controller updates ``disruptionsAllowed`` within about a second of a pod
    going away, so retrying faster is wasted."""

    watched_retry_s: float = Field(30.0, gt=0)
    """With the PDB watched (``budget_changes``), a refused eviction is asked again when a
    PDB covering its pod changes, and at least this often: the timer only stands in for a
    change the watch missed."""

    poll_interval_s: float = Field(0.5, gt=0)
    """How often ``wait_gone`` looks again."""
