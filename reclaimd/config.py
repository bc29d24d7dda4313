"""Typed settings: one YAML file, then ``RECLAIMD_*`` environment overrides.

An override names a path with double underscores: ``RECLAIMD_LEDGER__TOPIC=x`` sets
``ledger.topic``. Every field has a safe default, so an empty file is a valid (if idle)
configuration; a bad file fails with one line per error, every error at once, naming the
file and key or the variable (``reclaimd.configcheck``), never a traceback.

The sections are the parts' own models (``reclaimd.settings``, one module per concern): this
module composes them, with the sources' sections and the top-level fields, into ``Settings``.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import yaml
from pydantic import (
    Field,
    GetPydanticSchema,
    ValidationError,
    create_model,
    model_validator,
)
from pydantic_core import core_schema

from reclaimd import configcheck, handlers
from reclaimd.kafkaconn import KafkaSettings
from reclaimd.model import Windows
from reclaimd.settings.allocation import AllocationSettings
from reclaimd.settings.cache import CacheSettings
from reclaimd.settings.checkpoint import CheckpointSettings
from reclaimd.settings.claims import ClaimSettings
from reclaimd.settings.events import EventSettings
from reclaimd.settings.intake import IntakeSettings
from reclaimd.settings.kube import KubeSettings
from reclaimd.settings.ledger import LedgerSettings
from reclaimd.settings.peers import PeerProbeSettings
from reclaimd.settings.policy import PolicySettings
from reclaimd.settings.restarts import RestartSettings
from reclaimd.settings.tracing import TracingSettings
from reclaimd.strict import Strict

ENV_PREFIX = "RECLAIMD_"


class ConfigError(ValueError):
    """A configuration that cannot be used; the message is one line per error."""


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


class _Settings(Strict):
    cluster_name: str = "default"
    holder: str = Field(default_factory=socket.gethostname)
    # A claim whose holder's Lease is not renewed for this long is taken over, whatever the
    # probes say: the last word on a replica whose loop hangs while its probe port answers.
    # A stopped or unreachable replica goes sooner (peer_probe.silent_after_s), a killed one
    # at once. Renewals go first in the write budget.
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
    events: EventSettings = EventSettings()
    tracing: TracingSettings = TracingSettings()
    cache: CacheSettings = CacheSettings()
    claims: ClaimSettings = ClaimSettings()
    peer_probe: PeerProbeSettings = PeerProbeSettings()
    checkpoint: CheckpointSettings = CheckpointSettings()
    intake: IntakeSettings = IntakeSettings()
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
        if self.peer_probe.silent_after_s >= self.claim_stale_s:
            # Silence must say "dead" before the claims' own lease does, or it says nothing.
            raise ValueError(
                "peer_probe.silent_after_s must be shorter than claim_stale_s"
                f" ({self.peer_probe.silent_after_s:g} >= {self.claim_stale_s:g})"
            )
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
