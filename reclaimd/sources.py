"""The source registry: one entry per source, one loop in the daemon builds the enabled ones.

An entry names the source (its task, its metrics label), the parser its transport hands
payloads to (``handlers.PARSERS``), its section of ``Settings`` and that section's model
(the models live in ``reclaimd.config``), the factory that builds its transport, and
optionally what it must do after a notice's drain (``reclaimd.afterdrain``). Adding a source
is one handler module, one transport module and one line in ``REGISTRY``; the import
contracts in pyproject.toml keep handlers and transports from knowing one another, and keep
every other part from importing a transport: this module is where they are chosen.

Factories import their transport (and its client library: boto3, google-cloud-pubsub,
aiokafka) only when the source is enabled, and before the daemon's tasks start; nothing on
``reclaimd run``'s path imports one at module level (tests/unit/test_startup_imports.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel

from reclaimd.afterdrain import AfterDrain, AfterDrains, NoAfterDrain
from reclaimd.config import (
    GceMetadataSettings,
    ImdsSettings,
    KafkaNoticeSettings,
    KueueSettings,
    PubSubSettings,
    Settings,
    SqsSettings,
)
from reclaimd.model import Windows
from reclaimd.transports import Admit, Counters


class Source(Protocol):
    """A running transport: ``run()`` until cancelled, and what it saw."""

    @property
    def counters(self) -> Counters: ...

    async def run(self) -> None: ...


@dataclass(frozen=True)
class Wiring:
    """What a factory gets: the settings, the intake's ``admit``, and the clients it may use."""

    settings: Settings
    admit: Admit
    windows: Windows
    api: Any = None  # the Kubernetes ApiClient (Kueue watches Workloads through it)
    limiter: Any = None  # the write budget (Pub/Sub slot Leases are written through it)
    dead: Callable[[str], bool] | None = None  # a holder the peer probe found dead


@dataclass(frozen=True)
class Entry:
    name: str  # the task, the transport's metrics label
    parser: str  # a key of handlers.PARSERS
    section: str  # the field of Settings that configures it
    model: type[BaseModel]  # that field's settings model
    build: Callable[[Entry, Wiring], Source]
    after_drain: Callable[[Settings], AfterDrain] | None = None

    def settings_of(self, settings: Settings) -> Any:
        return getattr(settings, self.section)

    def enabled(self, settings: Settings) -> bool:
        return bool(self.settings_of(settings).enabled)


# --- factories: one per transport ------------------------------------------------------------


def _sqs(entry: Entry, w: Wiring) -> Source:
    import boto3
    from botocore.config import Config

    from reclaimd.transports.sqs import SqsSource

    s: SqsSettings = entry.settings_of(w.settings)
    # One connection per receiver and per message being settled: botocore's default pool of
    # 10 makes every delete in a storm wait for a socket.
    pool = Config(max_pool_connections=s.receivers + s.concurrency)
    sqs = boto3.client("sqs", region_name=s.region, endpoint_url=s.endpoint_url, config=pool)
    return SqsSource(sqs, s, admit=w.admit, windows=w.windows, parser=entry.parser)


def _asg_lifecycle(settings: Settings) -> AfterDrain:
    """Lifecycle actions arrive through the SQS queue; the same endpoint serves Auto Scaling
    (a VPC endpoint, moto)."""
    import boto3
    from botocore.config import Config

    from reclaimd.transports.lifecycle import AsgLifecycle

    s = settings.sqs
    retries = Config(retries={"mode": "standard", "max_attempts": 3})

    def client_for(region: str) -> Any:
        return boto3.client(
            "autoscaling", region_name=region, endpoint_url=s.endpoint_url, config=retries
        )

    return AsgLifecycle(client_for, region=s.region)


def _imds(entry: Entry, w: Wiring) -> Source:
    from reclaimd.transports.imds import ImdsSource

    s: ImdsSettings = entry.settings_of(w.settings)
    return ImdsSource(s, admit=w.admit, windows=w.windows, parser=entry.parser)


def _pubsub(entry: Entry, w: Wiring) -> Source:
    # The client library (and grpc) loaded now, while the daemon builds: first imported in
    # run(), its import (~0.3 s, ~50 MB) would stall the loop the cache and Leases run on.
    import google.cloud.pubsub_v1  # noqa: F401

    from reclaimd.transports.pubsub import PubSubSource, SlottedPubSubSource

    s: PubSubSettings = entry.settings_of(w.settings)
    if s.slots == 1:
        return PubSubSource(s, admit=w.admit, windows=w.windows, parser=entry.parser)
    from reclaimd.cluster.slots import PubSubSlots

    if w.settings.dry_run:
        # A slot is a Lease, a write: and a dry run must not take a live replica's slot.
        raise ValueError("pubsub.slots > 1 is not for a dry run: give it a subscription of its own")
    if w.api is None or w.limiter is None:
        raise ValueError("pubsub.slots > 1 needs the Kubernetes API for the slot Leases")
    slots = PubSubSlots(
        w.api,
        w.settings.lease_namespace,
        w.settings.holder,
        subscriptions=[s.slot_subscription(i) for i in range(s.slots)],
        lease_s=w.settings.claim_stale_s,
        limiter=w.limiter,
        dead=w.dead,
    )
    return SlottedPubSubSource(s, slots, admit=w.admit, windows=w.windows, parser=entry.parser)


def _gce_metadata(entry: Entry, w: Wiring) -> Source:
    from reclaimd.transports.gce_metadata import GceMetadataSource

    s: GceMetadataSettings = entry.settings_of(w.settings)
    return GceMetadataSource(s, admit=w.admit, windows=w.windows, parser=entry.parser)


def _kueue(entry: Entry, w: Wiring) -> Source:
    from reclaimd.transports.kueue import KueueSource

    s: KueueSettings = entry.settings_of(w.settings)
    return KueueSource(s, admit=w.admit, windows=w.windows, api=w.api, parser=entry.parser)


def _kafka_notices(entry: Entry, w: Wiring) -> Source:
    from reclaimd.transports.kafka_notices import KafkaNoticeSource

    s: KafkaNoticeSettings = entry.settings_of(w.settings)
    return KafkaNoticeSource(s, admit=w.admit, windows=w.windows, parser=entry.parser)


# fmt: off
REGISTRY: tuple[Entry, ...] = (
    Entry("sqs", "ec2", "sqs", SqsSettings, _sqs, after_drain=_asg_lifecycle),
    Entry("imds", "imds", "imds", ImdsSettings, _imds),
    Entry("pubsub", "gke", "pubsub", PubSubSettings, _pubsub),
    Entry("gce_metadata", "gce-metadata", "gce_metadata", GceMetadataSettings, _gce_metadata),
    Entry("kueue", "kueue", "kueue", KueueSettings, _kueue),
    Entry("kafka_notices", "kafka", "kafka_notices", KafkaNoticeSettings, _kafka_notices),
)
# fmt: on


def enabled(settings: Settings) -> list[Entry]:
    return [entry for entry in REGISTRY if entry.enabled(settings)]


def build(settings: Settings, *, admit: Admit, api: Any = None) -> dict[str, Source]:
    """Every enabled source's transport, by name; nothing runs yet."""
    wiring = Wiring(settings, admit, settings.windows, api)
    return {entry.name: entry.build(entry, wiring) for entry in enabled(settings)}


def after_drain(settings: Settings) -> AfterDrain:
    """What the enabled sources must do around a notice's drain, as one part."""
    parts = [e.after_drain(settings) for e in enabled(settings) if e.after_drain is not None]
    if not parts:
        return NoAfterDrain()
    return parts[0] if len(parts) == 1 else AfterDrains(parts)


def counters(sources: Mapping[str, Source]) -> dict[str, Counters]:
    return {name: source.counters for name, source in sources.items()}


def pubsub_slot(sources: Mapping[str, Source]) -> Callable[[], int] | None:
    """The Pub/Sub slot held (-1: none yet), read at scrape time; None without slots."""
    source = sources.get("pubsub")
    if source is None or not hasattr(source, "held_slot"):
        return None

    def held() -> int:
        slot = getattr(source, "held_slot", None)
        return -1 if slot is None else int(slot)

    return held
