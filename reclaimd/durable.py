"""The map of durable state: every record reclaimd keeps, where, for how long, who deletes it.

Everything else reclaimd holds is memory, rebuilt from these (and from the API server's
objects) after a restart. Two places hold state: the cluster (Leases in the release's Lease
namespace, and an annotation and a taint on the doomed objects), which survives any replica;
and the replica's own disk (files beside the ledger's outbox, ``LedgerSettings.beside_outbox``:
``outbox.sqlite`` -> ``outbox-<suffix>``, and the span file), which survives a restart of the
process on the same volume only. ``tests/unit/test_durable.py`` checks this table against the
code both ways: every Lease name prefix and every ``beside_outbox`` suffix the code uses is
here, and nothing here is missing from the code.

The table names writers by module path as prose, not by import: this module imports nothing,
so any part may read it (the import contracts keep sources apart; the Pub/Sub slots belong to
the Pub/Sub source).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Kind(StrEnum):
    LEASE = "Lease"  # coordination.k8s.io/v1, in the release's Lease namespace
    ANNOTATION = "annotation"  # on an object reclaimd does not own (a Node, a Workload)
    TAINT = "taint"  # on a Node
    FILE = "file"  # on the replica's own volume


@dataclass(frozen=True)
class Record:
    """One kind of durable record."""

    name: str
    kind: Kind
    # A Lease's name prefix, an annotation's or taint's key, a file's ``beside_outbox``
    # suffix, or (a file with a setting of its own) the setting's default path.
    where: str
    writer: str
    lifetime: str
    deleted_by: str


# A slotted source's Leases carry its registry name; the map names no source (a source's name
# lives in its own folder: tests/unit/test_source_identity.py).
SLOT_PREFIX = "reclaimd-{source}-slot-"

RECORDS: tuple[Record, ...] = (
    Record(
        "holder Lease",
        Kind.LEASE,
        "reclaimd-holder-",
        "reclaimd.cluster.holders (HolderLeases): one per replica, renewed every"
        " peer_probe.renew_every_s (1 s); annotated with the holder, its probe and metrics"
        " addresses, its peer group",
        "while the replica runs; released (not deleted) when it stops, so a successor learns"
        " it is gone",
        "any replica's holder sweep, once not renewed (or released) for GONE_AFTER_S (1 h)",
    ),
    Record(
        "gang Lease",
        Kind.LEASE,
        "gang-",
        "reclaimd.cluster.gangclaims (GangClaims): created by the replica whose notice charges"
        " the gang (the name's uniqueness is the lock), then its ranks' acks and the restart"
        " watcher's mark",
        "a gang's incarnation: every notice and takeover of it, then KEEP_S (6 h)",
        "any replica's gang sweep (GangClaims.run_sweeps, every 10 min), past KEEP_S",
    ),
    Record(
        "ledger record",
        Kind.LEASE,
        "reclaimd-ledger-",
        "reclaimd.cluster.ledgerlog (LedgerLog), for reclaimd.ledger.writer: one per unpublished"
        " event (the lock on its event id); adopted by a peer when its holder dies",
        "until the event is on the topic, then a tombstone for KEEP_PUBLISHED_S (6 h), so a"
        " charge repeated after a takeover is not published twice",
        "the ledger's recovery pass (LedgerLog.sweep, every 10 min), past KEEP_PUBLISHED_S",
    ),
    Record(
        "slot Lease",
        Kind.LEASE,
        SLOT_PREFIX,
        "a slotted source's slots (its registry entry's ``slotted``; the Pub/Sub subscriptions):"
        " one per subscription, held by the replica consuming it, renewed every third of lease_s",
        "while a replica consumes the subscription; released when it stops, else it expires"
        " after lease_s",
        "nobody: a slot is reused by name (one per configured subscription)",
    ),
    Record(
        "allocation hour lock",
        Kind.LEASE,
        "alloc-",
        "reclaimd.meter (LeaseHourLock): the replica that creates the hour's Lease meters it",
        "one per cluster and hour, never renewed",
        "nobody yet: they accumulate, one small Lease an hour (kubectl delete by the alloc-"
        " prefix)",
    ),
    Record(
        "claim",
        Kind.ANNOTATION,
        "reclaimd.io/claim",
        "reclaimd.cluster.claims (ClaimStore), through the intake and the claim log: the"
        " notice, holder, phase and deadline on the doomed Node or Kueue Workload",
        "the object's: a done claim stays, so a late copy of its notice is a duplicate",
        "nobody: replaced by the next notice's claim, gone with the object",
    ),
    Record(
        "interruption taint",
        Kind.TAINT,
        "reclaimd.io/interruption",
        "reclaimd.cluster.claims (in the claim's write) and reclaimd.cluster.actions, with the"
        " cordon",
        "the Node's: a reclaimed node is not put back",
        "nobody: gone with the Node",
    ),
    Record(
        "ledger outbox",
        Kind.FILE,
        "/var/lib/reclaimd/outbox.sqlite",
        "reclaimd.outbox (through reclaimd.ledger.writer): every event until Kafka acks it",
        "the volume's; sent rows are pruned after retention_s (7 d)",
        "nobody deletes the file; the publisher prunes its sent rows",
    ),
    Record(
        "pod snapshot",
        Kind.FILE,
        "pods.snapshot",
        "reclaimd.cluster.podsnapshot (for the cluster cache): GPU pods that departed, so a"
        " restarted replica still charges their gangs",
        "rewritten whole (temporary file, rename) as pods leave",
        "nobody: replaced by the next write; a damaged file is ignored",
    ),
    Record(
        "held notices",
        Kind.FILE,
        "held.sqlite",
        "reclaimd.heldnotices (HeldNotices, from the intake): notices received, not yet"
        " claimed",
        "a notice's admission: written as it starts, deleted once admitted for good",
        "the intake, row by row; the file stays",
    ),
    Record(
        "allocation outbox",
        Kind.FILE,
        "allocation.sqlite",
        "reclaimd.meter's LedgerWriter (allocation.outbox_path, else beside the ledger's"
        " outbox): the allocation rows until Kafka acks them",
        "as the ledger outbox's",
        "nobody deletes the file; the publisher prunes its sent rows",
    ),
    Record(
        "span file",
        Kind.FILE,
        "/var/lib/reclaimd/spans.jsonl",
        "reclaimd.tracing (tracing.span_file): one JSON line per span, when no OTLP endpoint"
        " takes them",
        "appended while the replica runs",
        "nobody: rotate or delete it outside reclaimd (reclaimd postmortem reads it)",
    ),
)


def of(kind: Kind) -> tuple[Record, ...]:
    """The records of one kind, in the table's order."""
    return tuple(r for r in RECORDS if r.kind is kind)


def beside_outbox_suffixes() -> frozenset[str]:
    """The files placed by ``LedgerSettings.beside_outbox`` (a suffix, not a path)."""
    return frozenset(r.where for r in of(Kind.FILE) if "/" not in r.where)
