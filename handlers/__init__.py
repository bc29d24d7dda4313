"""The source registry: every source's ``ENTRY``, and what the rest of reclaimd learns of them.

A source is one folder here (``handlers/<name>/``, imported as ``reclaimd.handlers.<name>``):
its pure parser (``parser``: raw transport payload in, normalized ``Notice``s out; see
``base.Parser`` and ``README.md``), its settings model (``settings``), its transport
(``transport``) and whatever only it owns, and an ``ENTRY`` (``entry.Entry``) naming it. This
module finds the folders that have one, the way it found parsers by ``NAME`` before, and
derives from them: ``Settings``' source sections, the parsers by source name (``reclaimd
parse --source``), the windows and their defaults, tracing's and metrics' reading of a notice's
source (``origin_of``), the providerID mapping (``instance_of``), the chart's source list
(deploy/helm/gen_sources.py); ``running`` builds the enabled ones for the daemon.

Shared parsing helpers (``base``, ``fields``, ``ids``, ``targets``) and what every transport
reads (``transport``) sit directly here and name no source. Importing this module imports
every source's entry, parser and settings, none of its transport: a transport is imported by
name, only for an enabled source (``running.build``), with its client library (boto3,
google-cloud-pubsub, aiokafka; tests/unit/test_startup_imports.py). Adding a source is one
folder; tests/unit/test_source_identity.py proves that no other product file names one.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator, Mapping
from datetime import datetime
from types import MappingProxyType
from typing import Any

from pydantic import BaseModel

from reclaimd.handlers.base import Parser, SavedParser
from reclaimd.handlers.entry import NOWHERE, Entry, Origin, SourceSettings
from reclaimd.model import ParseError, ParseOutcome, Windows


def _entries() -> tuple[Entry[Any], ...]:
    """Every folder of this package that names a source (``ENTRY``), in name order; the
    shared modules name none. Its folder's name is its entry's."""
    found: list[Entry[Any]] = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if not info.ispkg:
            continue
        entry = getattr(importlib.import_module(f"{__name__}.{info.name}"), "ENTRY", None)
        if entry is None:
            continue
        if entry.name != info.name:
            raise ImportError(f"handlers/{info.name}: its ENTRY is named {entry.name!r}")
        found.append(entry)
    return tuple(found)


def _windows(entries: tuple[Entry[Any], ...]) -> dict[str, float]:
    windows: dict[str, float] = {}
    for entry in entries:
        for window, seconds in entry.windows.items():
            if windows.setdefault(window, seconds) != seconds:
                raise ImportError(f"handlers: two defaults for window {window!r}")
    return dict(sorted(windows.items()))


# Listed in each entry's ``order`` (settings sections, the chart, the CLI's choices).
REGISTRY: tuple[Entry[Any], ...] = tuple(sorted(_entries(), key=lambda e: (e.order, e.name)))
BY_NAME: Mapping[str, Entry[Any]] = MappingProxyType({e.name: e for e in REGISTRY})
AGENTS: tuple[Entry[Any], ...] = tuple(e for e in REGISTRY if e.agent)
# Longest prefix first: the first match is the most specific (aws.imds. before aws.).
_BY_PREFIX = sorted(REGISTRY, key=lambda e: len(e.origin.prefix), reverse=True)

# ``reclaimd parse --source`` and ``parse`` take a source's name or one of its aliases (the
# rig's payload makers and scenarios still name parsers so).
ALIASES: Mapping[str, str] = MappingProxyType({a: e.name for e in REGISTRY for a in e.aliases})
PARSE_CHOICES: tuple[str, ...] = (*BY_NAME, *ALIASES)

# --- parsing --------------------------------------------------------------------------------

PARSERS: Mapping[str, Parser] = MappingProxyType({e.name: e.parse for e in REGISTRY})
# The sources whose saved documents are read otherwise than their transport's payload, and
# may name several instances (``reclaimd parse --vm``).
SAVED: Mapping[str, SavedParser] = MappingProxyType(
    {e.name: e.parse_saved for e in REGISTRY if e.parse_saved is not None}
)
# Every parser's windows and their defaults (``Windows``; ``Settings.windows`` offers them).
WINDOWS: Mapping[str, float] = MappingProxyType(_windows(REGISTRY))


def windows(**given: float) -> Windows:
    """Every window, its parser's default unless ``given`` (``default_s`` included)."""
    unknown = sorted(set(given) - set(WINDOWS) - {"default_s"})
    if unknown:
        raise ValueError(f"no window {', '.join(unknown)}; known: {', '.join(WINDOWS)}")
    return Windows(**{**WINDOWS, **given})


_DEFAULT_WINDOWS = windows()


def parse(
    source: str, payload: bytes, *, received_at: datetime, windows: Windows = _DEFAULT_WINDOWS
) -> ParseOutcome:
    """Parse ``payload`` as the named source delivers it; ``ParseError`` for unknown names."""
    parser = PARSERS.get(ALIASES.get(source, source))
    if parser is None:
        raise ParseError(f"unknown source {source!r}; known: {', '.join(sorted(PARSERS))}")
    return parser(payload, received_at=received_at, windows=windows)


def parse_saved(
    source: str,
    payload: bytes,
    *,
    received_at: datetime,
    windows: Windows = _DEFAULT_WINDOWS,
    target: str = "",
) -> ParseOutcome:
    """What a user saved from the source (``reclaimd parse``): its parser's ``parse_saved``
    where it has one (``target``: the instance to read it for), else its transport's payload
    (no ``target``)."""
    saved = SAVED.get(ALIASES.get(source, source))
    if saved is not None:
        return saved(payload, received_at=received_at, windows=windows, target=target)
    if target:
        raise ParseError(f"a {source} payload names its instance: no target to choose")
    return parse(source, payload, received_at=received_at, windows=windows)


# --- what a notice's source and a node's providerID say --------------------------------------


def origin_of(source: str) -> Origin:
    """The origin of a ``Notice.source`` (``NOWHERE`` when no entry's prefix matches)."""
    for entry in _BY_PREFIX:
        if source.startswith(entry.origin.prefix):
            return entry.origin
    return NOWHERE


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


# --- the settings' sources ------------------------------------------------------------------


def enabled(settings: BaseModel) -> list[Entry[Any]]:
    return [entry for entry in REGISTRY if entry.enabled(settings)]


def sections(settings: BaseModel) -> Iterator[tuple[Entry[Any], SourceSettings]]:
    for entry in REGISTRY:
        yield entry, entry.section(settings)


def destinations(settings: BaseModel) -> dict[str, str]:
    """``messaging.system`` -> the destination each message transport consumes."""
    return {
        entry.origin.messaging: section.destination()
        for entry, section in sections(settings)
        if entry.origin.messaging
    }


__all__ = [
    "AGENTS",
    "ALIASES",
    "BY_NAME",
    "NOWHERE",
    "PARSERS",
    "PARSE_CHOICES",
    "REGISTRY",
    "SAVED",
    "WINDOWS",
    "Entry",
    "Origin",
    "Parser",
    "SavedParser",
    "SourceSettings",
    "destinations",
    "enabled",
    "instance_of",
    "origin_of",
    "parse",
    "parse_saved",
    "sections",
    "windows",
]
