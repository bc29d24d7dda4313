"""What a source is: its settings section's base, its origin and its registry entry.

Every source folder (``handlers/<name>/``) names itself with an ``ENTRY`` built from these; the
registry (``reclaimd.handlers``) collects them. An entry is a source's identity: its one name
(its folder, its task, its transport's metrics label, its section of ``Settings`` and so its
``RECLAIMD_<NAME>__*`` overrides, the name ``reclaimd parse --source`` takes), its parser, its
settings model, its ``Origin`` (the ``Notice.source`` prefix its parser writes, and what that
means to traces and metrics), its node-agent mode if it has one (the chart's
``nodeAgent.source``), how a node's providerID on its cloud names an instance and its own typed
facts (``Facts``). This module imports no source and no transport.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar
from urllib.parse import urlsplit

from pydantic import BaseModel

from reclaimd.handlers.base import Parser, SavedParser
from reclaimd.model import Facts, Placement
from reclaimd.strict import Strict

# The package the source folders are in (``Entry.package``).
PACKAGE = "reclaimd.handlers"

# --- every source's settings ----------------------------------------------------------------


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


def http_url(url: str) -> bool:
    """``url`` is an http(s) URL with a host."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def unless_url(key: str, url: str, like: str) -> dict[str, str]:
    """``{key: why}`` unless ``url`` is an http(s) URL (a section's ``needs``)."""
    if http_url(url):
        return {}
    got = f"{url!r} is not an http(s) URL" if url else "not set"
    return {key: f"{got}: set it to {like}"}


# --- the entry ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Origin:
    """Where a notice came from, as the semantic conventions say it: its cloud and transport.

    ``prefix``: the start of every ``Notice.source`` the source's parser writes (the longest
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


NOWHERE = Origin()

S = TypeVar("S", bound=SourceSettings)


@dataclass(frozen=True)
class Entry(Generic[S]):
    """A source, as its folder's ``ENTRY`` names it; ``S`` is its settings section's model."""

    name: str  # the task, the transport's metrics label, the Settings section, the folder
    model: type[S]  # the section's settings model
    origin: Origin
    # Its parser (``parser.parse``), its reading of what a user saves where that differs
    # (``parser.parse_saved``), and the windows it reads with their defaults (``WINDOWS``).
    parse: Parser
    parse_saved: SavedParser | None = None
    windows: Mapping[str, float] = field(default_factory=dict)
    # The module of its folder whose ``after_drain(section)`` acts around a drain ("": none).
    after_drain: str = ""
    # The chart's nodeAgent.source value when the source runs per node ("": it does not), and
    # whether it reads its node's name (RECLAIMD_<NAME>__NODE_NAME, from the downward API).
    agent: str = ""
    agent_node_name: bool = False
    # Its settings have ``slots``, one per replica by default in the chart (each replica
    # consumes one slot).
    slotted: bool = False
    # The facts of its own its parser writes and a later step reads (``Facts``, defined in
    # its parser module); what any source may know (``Placement``, ``TraceContext``) is the
    # model's.
    facts: tuple[type[Facts], ...] = ()
    # A providerID of this source's cloud -> the instance it names (None: not this cloud's).
    # Unset: the last path segment of any ``scheme://...`` (``instance_of``).
    instance_of: Callable[[str], str | None] | None = None
    # Other names ``reclaimd parse --source`` (and ``reclaimd.handlers.parse``, which the
    # rig's payload makers call so) take for it: its parser's name from before a source was
    # one folder. Settings, labels, the ledger and the chart know the one name.
    aliases: tuple[str, ...] = ()
    # Where it is listed (settings sections, the chart, the CLI's choices): the order the
    # sources were added in.
    order: int = 0

    @property
    def package(self) -> str:
        """Its folder, as a package: ``reclaimd.handlers.<name>``."""
        return f"{PACKAGE}.{self.name}"

    @property
    def module(self) -> str:
        """Its transport, whose ``build(entry, supplies)`` makes the running source."""
        return f"{self.package}.transport"

    def section(self, settings: BaseModel) -> S:
        """This source's section of ``Settings``, typed: ``Settings`` holds every source's
        section as a field named for it (its YAML key), which mypy does not see, so a source's
        section is read through its entry, ``ENTRY.section(settings)``."""
        section: S = getattr(settings, self.name)
        return section

    def enabled(self, settings: BaseModel) -> bool:
        return self.section(settings).enabled
