"""The source registry: one entry per source, and everything else learns its sources here.

An entry is a source's identity: its one name (its task, its transport's metrics label, its
section of ``Settings`` and so its ``RECLAIMD_<NAME>__*`` overrides), the handler that parses
what its transport receives (``handlers.PARSERS``; the name ``reclaimd parse --source``
takes), its settings model, its ``Origin`` (the ``Notice.source`` prefix its handler writes,
and what that means to traces and metrics), its node-agent mode if it has one (the chart's
``nodeAgent.source``), how a node's providerID on its cloud names an instance, its own typed
facts (``Facts``), and the transport module that builds it. ``Settings``, the CLI's
choices, tracing's and metrics' reading of a notice's source, the providerID mapping and the
chart's source list and ``nodeAgent.source`` enum (deploy/helm/gen_sources.py) are all
derived from ``REGISTRY``.

Its windows (the deadlines its notices get by default) are its handler's ``WINDOWS``, which
``Settings.windows`` offers by name; its own facts, if a later step reads any, are defined in
its handler module (what writes them) and listed on its entry, and its cloud's providerID
grammar is in ``handlers/ids.py``. This module imports handlers; no handler imports it
(handlers import only ``reclaimd.model``). Adding a source is one handler module, one
transport module and one entry here (its settings model next to it);
tests/unit/test_source_identity.py proves that no other product file names one.
Transports are imported by name, only when their source is enabled (``reclaimd.sourcing``):
this module imports none, and is light enough for tracing and the ledger to read.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import urlsplit

from pydantic import Field, model_validator

from reclaimd.handlers.azure_scheduled import AzureEventFacts, AzureVmFacts
from reclaimd.handlers.ec2_spot import AsgLifecycleFacts
from reclaimd.handlers.ids import azure_instance
from reclaimd.model import Facts, Placement
from reclaimd.strict import Strict

# Each source's own facts are its handler's, next to what writes them; a transport reads its
# source's here, re-exported, as a transport imports no handler module (pyproject.toml's
# contract "Transports reach parsers only through the handlers registry").
__all__ = ["AsgLifecycleFacts", "AzureEventFacts", "AzureVmFacts"]

# --- each source's settings -----------------------------------------------------------------


class SourceSettings(Strict):
    """What every source's settings section has: off by default."""

    enabled: bool = False

    def destination(self) -> str:
        """The queue, subscription or topic a message transport consumes ("" for none): the
        ``messaging.destination.name`` of its receive spans."""
        return ""

    def check(self, *, dry_run: bool) -> None:
        """Refuse (``ValueError``) what this section cannot do with the rest of the settings."""

    def needs(self) -> dict[str, str]:
        """What an enabled section lacks to hear anything: its key -> what to set it to
        (``reclaimd.configcheck`` reports each as a line naming the file or the variable)."""
        return {}


def _http_url(url: str) -> bool:
    """``url`` is an http(s) URL with a host."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _unless_url(key: str, url: str, like: str) -> dict[str, str]:
    if _http_url(url):
        return {}
    got = f"{url!r} is not an http(s) URL" if url else "not set"
    return {key: f"{got}: set it to {like}"}


def sqs_region(queue_url: str, env: Mapping[str, str]) -> str:
    """Where an SQS queue is: the region its URL names (``https://sqs.<region>.amazonaws.com/``,
    ``.amazonaws.com.cn``, the legacy ``<region>.queue.amazonaws.com``), else ``AWS_REGION``,
    ``AWS_DEFAULT_REGION`` (what IRSA and Pod Identity set), else us-east-1."""
    host = queue_url.split("://", 1)[-1].split("/", 1)[0].split(":", 1)[0].lower()
    labels = host.split(".")
    if "amazonaws" in labels:
        if labels[0] == "sqs" and len(labels) > 2 and labels[1] != "amazonaws":
            return labels[1]
        if len(labels) > 2 and labels[1] == "queue":
            return labels[0]
    return env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1"


class SqsSettings(SourceSettings):
    queue_url: str = ""
    endpoint_url: str | None = None  # moto, LocalStack or a VPC endpoint
    # Empty: from queue_url, else AWS_REGION / AWS_DEFAULT_REGION, else us-east-1 (sqs_region).
    region: str = ""
    wait_time_s: int = Field(20, ge=0, le=20)
    batch_size: int = Field(10, ge=1, le=10)
    # Long polls in parallel: one receive loop caps ingest at a batch per round trip.
    receivers: int = Field(4, ge=1, le=32)
    # Messages being admitted at once (claim, then delete), across the receivers. More at
    # once is not faster: in a 1,000-notice bench, 512 missed more deadlines than 64 (every
    # admitted notice's writes compete for the same API server).
    concurrency: int = Field(64, ge=1, le=1000)
    # Short, and extended every third of it while a message is unsettled: a replica that dies
    # holding a message hands it to a peer after this long, not after SQS's 30 s default.
    visibility_timeout_s: int = Field(10, ge=5, le=43200)

    @model_validator(mode="before")
    @classmethod
    def _region_from_where_it_runs(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and not data.get("region"):
            url = data.get("queue_url") or ""
            return {**data, "region": sqs_region(url if isinstance(url, str) else "", os.environ)}
        return data

    def destination(self) -> str:
        return self.queue_url.rsplit("/", 1)[-1]

    def needs(self) -> dict[str, str]:
        like = "the queue's URL, https://sqs.<region>.amazonaws.com/<account>/<queue>"
        found = _unless_url("queue_url", self.queue_url, like)
        if not found and len([p for p in urlsplit(self.queue_url).path.split("/") if p]) != 2:
            found["queue_url"] = f"{self.queue_url!r} names no <account>/<queue>: set it to {like}"
        if self.endpoint_url is not None:
            found |= _unless_url("endpoint_url", self.endpoint_url, "an SQS endpoint, or unset it")
        return found


class ImdsSettings(SourceSettings):
    url: str = "http://169.254.169.254"
    poll_interval_s: float = Field(2.0, gt=0)
    token_ttl_s: int = Field(21600, ge=1, le=21600)

    def needs(self) -> dict[str, str]:
        return _unless_url("url", self.url, "IMDS, http://169.254.169.254")


class PubSubSettings(SourceSettings):
    """A Cloud Logging sink -> Pub/Sub subscription carrying GCE preemption audit entries."""

    project: str = ""
    subscription: str = ""  # the subscription id, not its full path
    max_messages: int = Field(100, ge=1)  # flow control: leased, unacked messages at most
    # The stream ack deadline and each lease extension (FlowControl's min and max): how long
    # a dead replica's messages stay leased. Pub/Sub allows 10..600; the client's 60 s default
    # is twice the GCE window.
    lease_extension_s: int = Field(10, ge=10, le=600)
    endpoint: str | None = None  # None: PUBSUB_EMULATOR_HOST or the real service
    # One subscription per replica, so that no message depends on one replica: with N > 1,
    # slot i consumes ``<subscription>-<i>`` (i = 0 .. N-1, all on the sink's topic; the
    # deployer creates them: deploy/gcp/main.tf) while this replica holds the slot's Lease
    # (``reclaimd.cluster.slots``), and the claim decides which replica acts. 1: every
    # replica shares ``<subscription>`` (a killed replica's messages wait out its lease).
    slots: int = Field(1, ge=1, le=64)
    # A replica taking a slot first seeks its subscription this far back (slots > 1 only):
    # what the slot's last holder had leased and not settled (it was killed) comes back at
    # once instead of after the lease, which on the emulator is 20-40 s. Unacked messages
    # published before that are dropped: older than any window plus policy.expired_after_s.
    # 0: no seek.
    rewind_s: int = Field(900, ge=0)

    def slot_subscription(self, index: int) -> str:
        """The subscription id slot ``index`` consumes (``subscription`` with one slot)."""
        if not 0 <= index < self.slots:
            raise ValueError(f"pubsub: slot {index} out of 0..{self.slots - 1}")
        return self.subscription if self.slots == 1 else f"{self.subscription}-{index}"

    @model_validator(mode="after")
    def _slot_names_fit(self) -> PubSubSettings:
        # A subscription id is at most 255 characters: the longest slot's must be one.
        longest = len(self.subscription) + (len(f"-{self.slots - 1}") if self.slots > 1 else 0)
        if longest > 255:
            raise ValueError("subscription: with its slot suffix longer than 255 characters")
        return self

    def destination(self) -> str:
        return self.subscription

    def needs(self) -> dict[str, str]:
        found = {}
        if not self.project:
            found["project"] = "not set: set it to the Google Cloud project of the subscription"
        if not self.subscription:
            found["subscription"] = (
                "not set: set it to the subscription id on the Logging sink's topic (not its path)"
            )
        elif "/" in self.subscription:
            found["subscription"] = "a path: set it to the subscription id alone"
        return found

    def check(self, *, dry_run: bool) -> None:
        # A slot is a Lease (a write), and a dry run must not take a live replica's slot.
        if dry_run and self.enabled and self.slots > 1:
            raise ValueError(
                "pubsub.slots: a dry run consumes one subscription of its own (slots: 1)"
            )


class GceMetadataSettings(SourceSettings):
    """Per-node mode on GCE: the metadata server's preempted and maintenance-event keys."""

    url: str = "http://metadata.google.internal"
    node_name: str = ""  # this node, from the downward API (spec.nodeName)
    timeout_s: float = Field(60.0, gt=0)  # wait_for_change hanging GET

    def needs(self) -> dict[str, str]:
        return _unless_url("url", self.url, "the metadata server, http://metadata.google.internal")


class AzureScheduledSettings(SourceSettings):
    """Per-node mode on Azure (AKS Spot pools): the metadata service's Scheduled Events."""

    url: str = "http://169.254.169.254"
    node_name: str = ""  # this node, from the downward API (spec.nodeName)
    # The docs recommend a poll a second; a Preempt gives at least 30 s.
    poll_interval_s: float = Field(1.0, gt=0)
    approve: bool = True  # POST StartRequests once a notice's gangs are drained

    def needs(self) -> dict[str, str]:
        return _unless_url("url", self.url, "IMDS, http://169.254.169.254")


class KueueSettings(SourceSettings):
    """Kueue Workloads whose eviction by preemption is a reclaim notice."""

    namespaces: tuple[str, ...] = ()  # empty: every namespace


class KafkaNoticeSettings(SourceSettings):
    """A generic notices topic: CloudEvents 1.0 JSON, one consumer group for all replicas."""

    bootstrap: str = ""
    topic: str = "reclaimd.notices"
    group_id: str = "reclaimd"
    # A replica silent this long loses its partitions to a peer (brokers bound it by
    # group.min/max.session.timeout.ms, 6 s .. 30 min by default). A stopping one leaves the
    # group at once, and a peer hears of it at its next heartbeat: hence 1 s, not 3 s.
    session_timeout_ms: int = Field(10_000, ge=1_000, le=1_800_000)
    heartbeat_interval_ms: int = Field(1_000, ge=100)

    @model_validator(mode="after")
    def _heartbeat_within_session(self) -> KafkaNoticeSettings:
        # Kafka's advice, a third at most: two lost heartbeats do not end the session.
        if self.heartbeat_interval_ms * 3 > self.session_timeout_ms:
            raise ValueError("heartbeat_interval_ms: at most a third of session_timeout_ms")
        return self

    def destination(self) -> str:
        return self.topic

    def needs(self) -> dict[str, str]:
        found = {}
        if not self.bootstrap.strip(" ,"):
            found["bootstrap"] = "not set: set it to the notices' brokers, host:port[,host:port]"
        if not self.topic:
            found["topic"] = "not set: set it to the topic the notices are produced to"
        return found


# --- the entry ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Origin:
    """Where a notice came from, as the semantic conventions say it: its cloud and transport.

    ``prefix``: the start of every ``Notice.source`` the source's handler writes (the longest
    matching prefix wins). ``label``: when set, every such source is this metrics label (the
    rest of it is a producer's free text)."""

    prefix: str = ""
    provider: str = ""  # cloud.provider
    platform: str = ""  # cloud.platform: the doomed resource is a VM, whatever runs on it
    messaging: str = ""  # messaging.system, "" when the transport is no message queue
    transport: str = ""  # reclaimd's name for a transport that is no message queue
    label: str = ""
    # Where a receive span names what it consumed (a subscription is not its topic).
    destination_key: str = "messaging.destination.name"
    # cloud.resource_id of the instance (its placement, its id) when the cloud has one.
    resource_id: Callable[[Placement, str], str] | None = None


def ec2_arn(where: Placement, instance_id: str) -> str:
    """An EC2 instance's ARN, when the event named all of its parts."""
    if instance_id and where.region and where.account:
        return f"arn:aws:ec2:{where.region}:{where.account}:instance/{instance_id}"
    return ""


NOWHERE = Origin()

S = TypeVar("S", bound=SourceSettings)


@dataclass(frozen=True)
class Entry(Generic[S]):
    name: str  # the task, the transport's metrics label, the Settings section
    parser: str  # a key of handlers.PARSERS: the handler's own name
    model: type[S]  # the section's settings model
    origin: Origin
    # The module under reclaimd.transports whose ``build(entry, wiring)`` makes the source
    # ("": the name), and one whose ``after_drain(section)`` acts around a drain ("": none).
    transport: str = ""
    after_drain: str = ""
    # The chart's nodeAgent.source value when the source runs per node ("": it does not), and
    # whether it reads its node's name (RECLAIMD_<NAME>__NODE_NAME, from the downward API).
    agent: str = ""
    agent_node_name: bool = False
    # Its settings have ``slots``, one per replica by default in the chart (each replica
    # consumes one slot).
    slotted: bool = False
    # The facts of its own its handler writes and a later step reads (``Facts``, defined in
    # its handler module); what any source may know (``Placement``, ``TraceContext``) is the
    # model's.
    facts: tuple[type[Facts], ...] = ()
    # A providerID of this source's cloud -> the instance it names (None: not this cloud's).
    # Unset: the last path segment of any ``scheme://...`` (``instance_of``).
    instance_of: Callable[[str], str | None] | None = None

    @property
    def module(self) -> str:
        return f"reclaimd.transports.{self.transport or self.name}"

    def settings_of(self, settings: Any) -> S:
        """This source's section of ``Settings``."""
        section: S = getattr(settings, self.name)
        return section

    def enabled(self, settings: Any) -> bool:
        return self.settings_of(settings).enabled


REGISTRY: tuple[Entry[Any], ...] = (
    Entry(
        "sqs", "ec2", SqsSettings,
        Origin("aws.", "aws", "aws_ec2", messaging="aws_sqs", resource_id=ec2_arn),  # EventBridge
        after_drain="lifecycle", facts=(AsgLifecycleFacts,),
    ),
    Entry(
        "imds", "imds", ImdsSettings,
        Origin("aws.imds.", "aws", "aws_ec2", transport="imds", resource_id=ec2_arn),
        agent="imds",
    ),
    Entry(
        "pubsub", "gke", PubSubSettings,
        Origin(
            "gcp.", "gcp", "gcp_compute_engine", messaging="gcp_pubsub",  # Logging sink
            destination_key="messaging.destination.subscription.name",
        ),
        slotted=True,
    ),
    Entry(
        "gce_metadata", "gce-metadata", GceMetadataSettings,
        Origin("gcp.metadata.", "gcp", "gcp_compute_engine", transport="gce_metadata"),
        agent="gce-metadata", agent_node_name=True,
    ),
    Entry(
        "azure_scheduled", "azure-scheduled", AzureScheduledSettings,
        Origin("azure.scheduled.", "azure", "azure_vm", transport="azure_scheduled"),
        after_drain="azure_scheduled", agent="azure-scheduled", agent_node_name=True,
        facts=(AzureVmFacts, AzureEventFacts), instance_of=azure_instance,
    ),
    Entry(
        "kueue", "kueue", KueueSettings,
        Origin("kueue.", transport="kubernetes_watch"),
    ),
    Entry(
        "kafka_notices", "kafka", KafkaNoticeSettings,
        Origin("kafka:", messaging="kafka", label="kafka"),
    ),
)  # fmt: skip

BY_NAME: Mapping[str, Entry[Any]] = {e.name: e for e in REGISTRY}
PARSER_NAMES: tuple[str, ...] = tuple(e.parser for e in REGISTRY)
AGENTS: tuple[Entry[Any], ...] = tuple(e for e in REGISTRY if e.agent)
# Longest prefix first: the first match is the most specific (aws.imds. before aws.).
_BY_PREFIX = sorted(REGISTRY, key=lambda e: len(e.origin.prefix), reverse=True)


def enabled(settings: Any) -> list[Entry[Any]]:
    return [entry for entry in REGISTRY if entry.enabled(settings)]


def sections(settings: Any) -> Iterator[tuple[Entry[Any], SourceSettings]]:
    for entry in REGISTRY:
        yield entry, entry.settings_of(settings)


def origin_of(source: str) -> Origin:
    """The origin of a ``Notice.source`` (``NOWHERE`` when no entry's prefix matches)."""
    for entry in _BY_PREFIX:
        if source.startswith(entry.origin.prefix):
            return entry.origin
    return NOWHERE


def destinations(settings: Any) -> dict[str, str]:
    """``messaging.system`` -> the destination each message transport consumes."""
    return {
        entry.origin.messaging: section.destination()
        for entry, section in sections(settings)
        if entry.origin.messaging
    }


def instance_of(provider_id: str) -> str:
    """The cloud instance a node's ``spec.providerID`` names, "" when it names none:
    ``aws:///us-east-2a/i-0abc`` -> ``i-0abc``; ``gce://p/z/name`` -> ``name``. The one place
    a providerID is read (the cluster cache's index, the ledger's placement)."""
    for entry in REGISTRY:
        if entry.instance_of is not None and (found := entry.instance_of(provider_id)) is not None:
            return found
    if "://" not in provider_id:
        return ""
    last = provider_id.rstrip("/").rsplit("/", 1)[-1]
    return "" if last.endswith(":") else last
