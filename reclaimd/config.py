"""Typed settings: one YAML file, then ``RECLAIMD_*`` environment overrides.

An override names a path with double underscores: ``RECLAIMD_LEDGER__TOPIC=x`` sets
``ledger.topic``. Every field has a safe default, so an empty file is a valid (if idle)
configuration; a bad file fails with one line per error, every error at once, naming the
file and key or the variable (``reclaimd.configcheck``), never a traceback.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Annotated, Any

import yaml
from pydantic import (
    Field,
    GetPydanticSchema,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)
from pydantic_core import core_schema

from reclaimd import configcheck, handlers
from reclaimd.annotations import UrlPolicy
from reclaimd.kafkaconn import KafkaSettings
from reclaimd.model import Windows
from reclaimd.strict import Strict

ENV_PREFIX = "RECLAIMD_"


class ConfigError(ValueError):
    """A configuration that cannot be used; the message is one line per error."""


_Strict = Strict


class EvictionPolicy(StrEnum):
    RESPECT_PDB = "respect-pdb"  # never break a PDB; report the gang as blocked
    FORCE_NEAR_DEADLINE = "force-near-deadline"  # delete with grace once the deadline is close


class UnknownTarget(StrEnum):
    DROP = "drop"  # count it and ack the message: the instance is not in this cluster
    RETRY = "retry"  # leave the message for redelivery (a node may still be registering)


class PolicySettings(_Strict):
    eviction: EvictionPolicy = EvictionPolicy.FORCE_NEAR_DEADLINE
    # With force-near-deadline: stop honouring a PDB this many seconds before the deadline.
    force_before_s: float = Field(15.0, ge=0)
    # A saved gang's pod refused by PDBs that guard only its own gang is deleted at once.
    drain_when_saved: bool = True
    delete_grace_s: int = Field(5, ge=0)
    # Time kept back from the checkpoint budget for the drain: min(s, fraction x window).
    drain_reserve_s: float = Field(30.0, ge=0)
    drain_reserve_fraction: float = Field(0.34, ge=0, le=0.9)
    unknown_target: UnknownTarget = UnknownTarget.DROP
    # A notice whose deadline passed longer ago than this is acked and not acted on.
    expired_after_s: float = Field(300.0, ge=0)
    # Drain concurrency per notice; the client-side rate limiter bounds the total.
    evict_concurrency: int = Field(32, ge=1)
    # Backoff between evictions a PDB refused, and how often a drain looks for its pods again.
    retry_base_s: float = Field(0.5, gt=0)
    retry_cap_s: float = Field(5.0, gt=0)
    # With the PDB watched, a refused eviction is asked again when its PDB changes, and at
    # least this often (in case the watch missed a change).
    watched_retry_s: float = Field(30.0, gt=0)
    poll_interval_s: float = Field(0.5, gt=0)


class LedgerWriterSettings(_Strict):
    """The ledger writer's tuning (``LedgerWriter(**s.ledger.writer.fields())``)."""

    batch_size: int = Field(100, ge=1, le=10_000)  # events per Kafka transaction
    backoff_initial_s: float = Field(0.5, gt=0)  # after a failed publish, doubling to
    backoff_max_s: float = Field(30.0, gt=0)
    request_timeout_ms: int = Field(30_000, ge=1000)
    client_id: str = Field("reclaimd-ledger", min_length=1, max_length=200)
    retention_s: float = Field(7 * 86_400, gt=0)  # published rows kept in the outbox
    recover_every_s: float = Field(10.0, gt=0)  # dead peers' events looked for this often
    scan_margin_s: float = Field(600.0, ge=0)  # topic scan for an unknown outcome: back this far
    scan_timeout_s: float = Field(120.0, gt=0)


class LedgerSettings(_Strict):
    bootstrap: str = ""  # empty: events stay in the outbox until a broker is configured
    topic: str = "reclaimd.restart-waste"
    outbox_path: Path = Path("/var/lib/reclaimd/outbox.sqlite")
    label_allowlist: tuple[str, ...] = ("tenant", "queue", "sku", "cell", "purchase_option")
    writer: LedgerWriterSettings = LedgerWriterSettings()

    def beside_outbox(self, suffix: str) -> Path:
        """A file of this replica's state next to the outbox (same volume, same lifetime):
        ``outbox.sqlite`` -> ``outbox-<suffix>``."""
        return self.outbox_path.with_name(f"{self.outbox_path.stem}-{suffix}")


class AllocationSettings(_Strict):
    """The allocation meter: GPU-, MIG- and HBM-hours per hour and instance, by cost label,
    for ``reclaimd report``. One replica meters each hour (an hourly Lease)."""

    enabled: bool = False
    topic: str = "reclaimd.allocation"  # a sibling of the ledger topic, same broker
    # None: next to the ledger's outbox (``<outbox>-allocation.sqlite``).
    outbox_path: Path | None = None
    interval_s: float = Field(30.0, gt=0)
    # The open hour's running total is written this often (replaced when the hour closes).
    open_every_s: float = Field(300.0, gt=0)


class RestartSettings(_Strict):
    """Restart overhead (docs/ledger.md): from a notice's receipt until the gang it charged
    trains again, on the ledger topic as ``reclaimd.restart-overhead/v1``."""

    enabled: bool = True
    interval_s: float = Field(15.0, gt=0)  # the charged gangs' Leases are read this often
    # A rank that speaks the SDK's /incarnation but has not stepped this long after all pods
    # were Ready: the restart is measured to Ready.
    sdk_wait_s: float = Field(600.0, ge=0)


class EventsSettings(_Strict):
    """Kubernetes Events on nodes and pods (``kubectl get events --field-selector
    reason=Interrupted``): best effort, last in the write budget, dropped rather than late."""

    enabled: bool = True
    queue_size: int = Field(1024, ge=1, le=1_000_000)
    max_age_s: float = Field(60.0, gt=0)  # an event that waited this long is dropped
    series_window_s: float = Field(360.0, gt=0)  # a repeat within this joins the series
    series_flush_s: float = Field(30.0, gt=0)  # a series is patched at most this often
    series_cache: int = Field(4096, ge=1, le=1_000_000)  # distinct events remembered
    writers: int = Field(2, ge=1, le=64)  # events written at once


class WatchConfig(_Strict):
    """The cluster cache's LIST+WATCH loops (``WatchSettings(**s.cache.watch.fields())``)."""

    inactivity_timeout_s: float = Field(70.0, gt=0)  # silence that means a dead connection
    server_timeout_s: int = Field(300, ge=1, le=3600)  # timeoutSeconds asked of the server
    page_size: int = Field(250, ge=1, le=10_000)  # LIST page size
    backoff_base_s: float = Field(0.5, gt=0)
    backoff_cap_s: float = Field(30.0, gt=0)


class CacheConfig(_Strict):
    """What the cluster cache watches and how (``CacheSettings``)."""

    namespaces: tuple[str, ...] = ()  # pods and Workloads watched; empty: the whole cluster
    watch_workloads: bool = True
    watch_pdbs: bool = True  # a refused eviction is retried when its PDB changes
    permanent_error_pause_s: float = Field(30.0, gt=0)  # after RBAC/CRD-missing failures
    # A watch with no LIST, event or BOOKMARK for this long is restarted by its supervisor,
    # which looks this often.
    stall_after_s: float = Field(150.0, gt=0)
    supervise_interval_s: float = Field(2.0, gt=0)
    # The pods, kept on the replica's disk for its next process (a pod deleted while no
    # replica ran is still charged). None: next to the ledger's outbox, ``pods.snapshot``.
    snapshot_path: Path | None = None
    watch: WatchConfig = WatchConfig()


class ClaimsConfig(_Strict):
    """The claim store (``ClaimSettings``; its lease is ``claim_stale_s``)."""

    max_conflicts: int = Field(20, ge=1, le=1000)  # re-reads after 409 before giving up
    # A claim is given up (its message back to the transport, for a peer) once the API server
    # has answered nothing of ours for this long: a replica cut off must not hold it.
    unanswered_s: float = Field(10.0, gt=0, le=300)


class CheckpointConfig(_Strict):
    """The checkpoint requests reclaimd sends to the ranks (docs/checkpoint-contract.md)."""

    # On: a checkpoint URL must name the pod's own IP or an allowed host; off: any host.
    require_pod_ip: bool = True
    # Exceptions: host names (matched exactly), IP addresses and CIDRs, e.g. 127.0.0.1 for
    # trainers on loopback in a drill, or a checkpoint sidecar's Service name.
    allowed_hosts: tuple[str, ...] = ()
    poll_interval_s: float = Field(0.5, gt=0, le=60)  # a status URL is polled this often
    concurrency: int = Field(64, ge=1, le=65_536)  # requests in flight per gang
    # reclaimd's projected ServiceAccount token (audience reclaimd.io/checkpoint), sent with
    # every request to a rank so that ranks can verify who asks (reclaimd/identity.py); the
    # chart mounts it here. None: requests carry no token (a rank that verifies refuses them).
    identity_token_file: Path | None = None

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        UrlPolicy.parse(value)  # a ValueError becomes one line naming the field
        return value

    def url_policy(self) -> UrlPolicy:
        return UrlPolicy.parse(self.allowed_hosts, require_pod_ip=self.require_pod_ip)


class PeerProbeConfig(_Strict):
    """The peers' death detector (``cluster.probe``): each replica listens on ``host:port``
    and names that address in its holder Lease; the others connect to it every ``every_s``.
    Refused = dead now (its claims are taken over at once); anything else waits for
    ``claim_stale_s``. A replica taking a notice over also asks its holder there for the
    acks it could not record, for up to ``ask_s``. The chart opens the port to the other
    replicas only."""

    enabled: bool = True
    host: str = ""  # where to listen; empty: every interface
    port: int = Field(0, ge=0, le=65535)  # 0: any free one (the chart fixes 9465)
    # The address peers dial; empty: $POD_IP (the chart sets it), else 127.0.0.1.
    advertise: str = ""
    every_s: float = Field(0.5, gt=0, le=60)
    timeout_s: float = Field(0.5, gt=0, le=60)
    ask_s: float = Field(1.0, gt=0, le=60)


class IntakeConfig(_Strict):
    memory: int = Field(50_000, ge=100, le=10_000_000)  # notice ids remembered as seen


class KubeSettings(_Strict):
    # None: in-cluster service account. A kubeconfig may give a client certificate, a token or
    # tokenFile, or an exec plugin (EKS, GKE, AKS); auth-provider is refused (kubeconfig.py).
    kubeconfig: Path | None = None
    # The write budget adapts between these: it starts at start_qps, grows while the API
    # server accepts, halves on 429 / Retry-After / priority-and-fairness rejections, and
    # never exceeds qps (the operator's cap). Every write (claims, evictions, Leases) shares
    # it, earliest deadline first.
    qps: float = Field(1000.0, gt=0)
    start_qps: float = Field(300.0, gt=0)
    min_qps: float = Field(5.0, gt=0)
    burst: int = Field(100, ge=1)
    # Connections to the API server: a storm's writes in flight at once.
    connections: int = Field(64, ge=1, le=1024)
    # While the server accepts, the write rate grows by this fraction of itself per second.
    growth_per_s: float = Field(0.25, gt=0, le=10)
    # A retried write backs off with full jitter between these, never past its deadline.
    retry_base_s: float = Field(0.2, gt=0)
    retry_cap_s: float = Field(5.0, gt=0)
    max_attempts: int = Field(8, ge=1, le=100)  # of one write that has no deadline to bound it
    attempt_timeout_s: float = Field(10.0, gt=0)  # one request the server never answers
    max_conflicts: int = Field(8, ge=1, le=1000)  # re-reads of one object after 409s
    # A 403 is retried this long (a restarted API server's authorizer is still syncing).
    forbidden_grace_s: float = Field(3.0, ge=0)
    # Writes sent and not yet answered: beyond what the server works on at once they queue
    # there in its order, not ours (earliest deadline first).
    max_in_flight: int = Field(32, ge=1, le=1024)


class TracingSettings(_Strict):
    span_file: Path | None = Path("/var/lib/reclaimd/spans.jsonl")


# ``windows``: every window a parser reads (``handlers.WINDOWS``, with its default) and
# default_s, refused when misspelt like any section; held as the parsers' ``Windows``.
_WindowsSection = create_model(
    "Windows",
    __base__=Strict,
    __module__=__name__,
    default_s=(float, 120.0),
    **{name: (float, seconds) for name, seconds in handlers.WINDOWS.items()},  # type: ignore[call-overload]
)


def _windows_schema(_: Any, handler: Any) -> core_schema.CoreSchema:
    as_windows = core_schema.no_info_plain_validator_function(
        lambda section: Windows(**section.model_dump())
    )
    return core_schema.no_info_before_validator_function(
        lambda value: value.as_dict() if isinstance(value, Windows) else value,
        core_schema.chain_schema([handler.generate_schema(_WindowsSection), as_windows]),
        serialization=core_schema.plain_serializer_function_ser_schema(Windows.as_dict),
    )


WindowsSection = Annotated[Windows, GetPydanticSchema(_windows_schema)]


class _Settings(_Strict):
    cluster_name: str = "default"
    holder: str = Field(default_factory=socket.gethostname)
    # A replica silent this long (its holder Lease not renewed) is presumed dead and its claims
    # are taken over: a hung one is replaced within about this plus a resume scan (3 s).
    # Shorter takes over sooner, but a replica slowed by a storm's API server then loses live
    # claims (15 s did, in the storm bench). Renewals go first in the write budget.
    claim_stale_s: float = Field(20.0, gt=0)
    # Where the per-gang Leases live (reclaimd's own namespace: its Role covers only this one).
    lease_namespace: str = "reclaimd"
    # The replicas that resume each other's claims; empty: "<lease_namespace>/<cluster_name>".
    # Two deployments on one cluster (a canary with its own queue) need different groups.
    peer_group: str = ""
    windows: WindowsSection = handlers.windows()
    kube: KubeSettings = KubeSettings()
    policy: PolicySettings = PolicySettings()
    # How every Kafka client connects (TLS, mTLS, SASL, MSK IAM): reclaimd.kafkaconn.
    kafka: KafkaSettings = KafkaSettings()
    ledger: LedgerSettings = LedgerSettings()
    allocation: AllocationSettings = AllocationSettings()
    restarts: RestartSettings = RestartSettings()
    events: EventsSettings = EventsSettings()
    tracing: TracingSettings = TracingSettings()
    cache: CacheConfig = CacheConfig()
    claims: ClaimsConfig = ClaimsConfig()
    peer_probe: PeerProbeConfig = PeerProbeConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    intake: IntakeConfig = IntakeConfig()
    metrics_port: int = Field(9464, ge=0, le=65535)
    # The first LIST of every node and GPU pod must finish within this, or the process exits
    # (and is restarted). 50,000 pods take tens of seconds from a busy API server.
    cache_sync_timeout_s: float = Field(180.0, gt=0)
    # Notices handled at once. Each waits (for acks, for pods to go) as a cheap task, not a
    # worker; this bounds memory, while the write budget bounds the load on the API server.
    max_in_flight: int = Field(4096, ge=1, le=100_000)
    # Checkpoint requests in flight at once, across every gang of every notice.
    checkpoint_connections: int = Field(4096, ge=1, le=65_536)
    # The security floor's maxPutObjectQpsPerSa: each tenant's checkpoint uploads, all ranks
    # together, per replica. Each request tells the rank its share (docs/checkpoint-contract.md).
    max_put_object_qps_per_sa: float = Field(20.0, gt=0)
    # A notice is acted on this long before its deadline at the earliest (a Health change
    # weeks out is claimed now, drained then).
    schedule_horizon_s: float = Field(600.0, gt=0)
    # Decide everything, do nothing: log and count what would be claimed, signalled, evicted
    # and recorded (``reclaimd.dryrun``); ``reclaimd run --dry-run`` sets it too.
    dry_run: bool = False

    @model_validator(mode="after")
    def _sources_fit(self) -> _Settings:
        for _, section in handlers.sections(self):
            section.check(dry_run=self.dry_run)
        return self



def settings_model(registry: Iterable[handlers.Entry[Any]]) -> type[_Settings]:
    """The settings: the sections above, and one per source of ``registry``, named and typed
    by its entry (``<name>: {...}`` in the file, ``RECLAIMD_<NAME>__<KEY>`` in the
    environment). To mypy a source's section is no attribute: it is read, typed, through its
    entry (``Entry.section``), and this module names no source."""
    model: type[_Settings] = create_model(  # type: ignore[call-overload]
        "Settings",
        __base__=_Settings,
        __module__=__name__,
        **{entry.name: (entry.model, entry.model()) for entry in registry},
    )
    return model


if TYPE_CHECKING:
    Settings = _Settings
else:
    Settings = settings_model(handlers.REGISTRY)


@dataclass(frozen=True)
class CodePart:
    """Where one part's settings come from in this file.

    ``section``: the dotted path of the section whose fields share the part's field names
    (``""``: the top level). ``elsewhere``: the part's fields set another way, each naming
    the config path it is set from, or why it is no setting (``"discovered: ..."``).
    ``defaults_differ``: fields whose config default is deliberately not the code's.
    """

    section: str
    elsewhere: Mapping[str, str] = field(default_factory=dict)
    defaults_differ: frozenset[str] = frozenset()


_DISCOVERED_KUEUE = "discovered: the Kueue API version the cluster serves"
# Every settings dataclass (and tunable constructor) in the code, and where its fields are
# set from. tests/unit/test_config_reach.py walks the code: a new setting without an entry
# here fails it.
CODE_SETTINGS: Mapping[str, CodePart] = MappingProxyType(
    {
        "reclaimd.cluster.watch.WatchSettings": CodePart("cache.watch"),
        "reclaimd.cluster.cache.CacheSettings": CodePart(
            "cache",
            {
                "watch": "cache.watch",
                "workloads": _DISCOVERED_KUEUE,
                "url_policy": "checkpoint.allowed_hosts",
            },
        ),
        "reclaimd.cluster.claims.ClaimSettings": CodePart(
            "claims", {"lease_s": "claim_stale_s", "workloads": _DISCOVERED_KUEUE}
        ),
        # The adaptive rate starts below the cap in a deployment (the code's None: at the cap).
        "reclaimd.cluster.ratelimit.RateSettings": CodePart(
            "kube", defaults_differ=frozenset({"start_qps"})
        ),
        "reclaimd.cluster.actions.ActionSettings": CodePart(
            "policy", {"policy": "policy.eviction"}
        ),
        "reclaimd.cluster.events.EventSettings": CodePart("events"),
        "reclaimd.checkpoint.CheckpointSettings": CodePart("checkpoint"),
        "reclaimd.ledger.writer.LedgerWriter": CodePart(
            "ledger.writer", {"holder": "holder", "policy": "ledger.label_allowlist"}
        ),
        "reclaimd.intake.Intake": CodePart("intake", {"expire_after": "policy.expired_after_s"}),
        "reclaimd.scheduler.Scheduler": CodePart(
            "", {"max_in_flight": "max_in_flight", "horizon_s": "schedule_horizon_s"}
        ),
        "reclaimd.scheduler.EdfQueue": CodePart("", {"horizon_s": "schedule_horizon_s"}),
        "reclaimd.meter.Meter": CodePart("allocation"),
    }
)


def overlay(
    data: dict[str, Any],
    env: Mapping[str, str],
    origins: dict[tuple[str, ...], str] | None = None,
) -> dict[str, Any]:
    """``data`` with the ``RECLAIMD_<SECTION>__<KEY>`` overrides of ``env`` set in it; each
    path set is recorded in ``origins`` with the variable that set it."""
    for key, value in sorted(env.items()):
        if not key.startswith(ENV_PREFIX):
            continue
        path = key[len(ENV_PREFIX) :].lower().split("__")
        # The RECLAIMD_ prefix is shared with tooling (RECLAIMD_STACK_DIR, ...): only names
        # of settings are overrides. Below the top level, a misspelt key is still refused.
        if path[0] not in Settings.model_fields:
            continue
        node = data
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(
                    f"{key}: {'.'.join(path[:-1])} is not a section: unset the variable"
                )
            node = child
        node[path[-1]] = value
        if origins is not None:
            origins[tuple(path)] = key
    return data


def load(
    path: str | Path | None,
    env: Mapping[str, str] | None = None,
    *,
    require_source: bool = False,
) -> Settings:
    """Read ``path`` (optional), apply overrides from ``env``, validate; every error at once,
    one line each (``reclaimd.configcheck``), an enabled source lacking what it needs
    included, and with ``require_source`` (``check-config``) a file that enables none."""
    data: Any = {}
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigError(f"{path}: {e.strerror or e}: give a readable settings file") from e
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            at = f" at line {mark.line + 1}" if mark is not None else ""
            raise ConfigError(f"{path}: not valid YAML{at}: mend the file there") from e
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: the top level must be a mapping: write key: value lines")
    origins: dict[tuple[str, ...], str] = {}
    data = overlay(data, os.environ if env is None else env, origins)
    where = configcheck.Where(None if path is None else str(path), origins)
    errors: list[str] = []
    settings: Settings | None = None
    try:
        settings = Settings.model_validate(data)
    except ValidationError as e:
        errors = configcheck.validation_lines(e, Settings, where)
    errors += configcheck.source_lines(data, where, require_source=require_source)
    if errors or settings is None:
        raise ConfigError("\n".join(errors))
    return settings
