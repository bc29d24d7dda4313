"""The enabled sources, built: one loop in the daemon turns ``reclaimd.sources.REGISTRY``
into running transports.

Each transport module (``Entry.module``) has ``build(entry, wiring)``, which imports its
client library (boto3, google-cloud-pubsub, aiokafka) when called: a module is imported here,
by name, only for an enabled source, before the daemon's tasks start; nothing on ``reclaimd
run``'s path imports a transport or its library otherwise (tests/unit/test_startup_imports.py).
The import contracts in pyproject.toml keep handlers and transports from knowing one another,
and every other part from importing a transport.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from reclaimd import logs
from reclaimd.afterdrain import AfterDrain, AfterDrains, NoAfterDrain
from reclaimd.sources import BY_NAME, Entry, enabled

if TYPE_CHECKING:
    from reclaimd.cluster.apiserver import ApiServer
    from reclaimd.config import Settings
    from reclaimd.model import Windows
    from reclaimd.transports import Admit, Counters

log = logging.getLogger(__name__)


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
    api: ApiServer | None = None  # the API server (Kueue watches Workloads through it)
    limiter: Any = None  # the write budget (Pub/Sub slot Leases are written through it)
    dead: Callable[[str], bool] | None = None  # a holder the peer probe found dead


def build_one(entry: Entry[Any], wiring: Wiring) -> Source:
    """``entry``'s transport, built by its module (imported now)."""
    source: Source = importlib.import_module(entry.module).build(entry, wiring)
    return source


def build(settings: Settings, *, admit: Admit, api: Any = None) -> dict[str, Source]:
    """Every enabled source's transport, by name; nothing runs yet."""
    wiring = Wiring(settings, admit, settings.windows, api)
    return {entry.name: build_one(entry, wiring) for entry in enabled(settings)}


def after_drain(settings: Settings) -> AfterDrain:
    """What the enabled sources must do around a notice's drain, as one part."""
    parts: list[AfterDrain] = [
        importlib.import_module(f"reclaimd.transports.{e.after_drain}").after_drain(
            e.settings_of(settings)
        )
        for e in enabled(settings)
        if e.after_drain
    ]
    if not parts:
        return NoAfterDrain()
    return parts[0] if len(parts) == 1 else AfterDrains(parts)


def counters(sources: Mapping[str, Source]) -> dict[str, Counters]:
    return {name: source.counters for name, source in sources.items()}


def hearing(sources: Mapping[str, Source]) -> dict[str, Callable[[], bool]]:
    """A readiness check per running central source, by its name: it is not deaf (its
    receives have not failed for longer than a few rounds, ``Counters.deaf``). A node agent
    serves its own node only: its failures are its metrics', not the replicas' readiness.
    Turning deaf is logged once, with the source's last failure: why it cannot hear."""

    def hears(name: str, source: Source) -> Callable[[], bool]:
        said = False

        def check() -> bool:
            nonlocal said
            c = source.counters
            deaf = c.deaf()
            if deaf and not said:
                logs.event(log, "source cannot hear", logging.ERROR, source=name,
                           problem=c.problem, failing_s=round(c.failing_s(), 1))  # fmt: skip
            said = deaf
            return not deaf

        return check

    return {
        name: hears(name, source)
        for name, source in sources.items()
        if name in BY_NAME and not BY_NAME[name].agent
    }


@dataclass(frozen=True)
class Slot:
    """A source that consumes one of several slots (a Lease each): which one it holds."""

    help: str
    held: Callable[[], int]  # -1: none yet


def slots(sources: Mapping[str, Source]) -> dict[str, Slot]:
    """``<name>_slot`` gauges, read at scrape time: the sources that hold a slot
    (``held_slot``, with its ``slot_help``); none without slots."""
    found: dict[str, Slot] = {}
    for name, source in sources.items():
        if not hasattr(source, "held_slot"):
            continue

        def held(source: Source = source) -> int:
            slot = getattr(source, "held_slot", None)
            return -1 if slot is None else int(slot)

        found[name] = Slot(str(getattr(source, "slot_help", "")), held)
    return found
