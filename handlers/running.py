"""The enabled sources, built: the daemon turns the registry's enabled entries into running
transports, the parts that act around a drain, and what metrics and readiness read of them.

Each transport module (``Entry.module``) has ``build(entry, supplies)``, which imports its
client library (boto3, google-cloud-pubsub, aiokafka) when called: a module is imported here,
by name, only for an enabled source, before the daemon's tasks start; nothing on ``reclaimd
run``'s path imports a transport or its library otherwise (tests/unit/test_startup_imports.py).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reclaimd import logs
from reclaimd.afterdrain import AfterDrain, AfterDrains, NoAfterDrain
from reclaimd.handlers import BY_NAME, Entry, enabled
from reclaimd.handlers.transport import Admit, Counters, Source, Supplies

if TYPE_CHECKING:
    from reclaimd.config import Settings

log = logging.getLogger(__name__)


def build_one(entry: Entry[Any], supplies: Supplies) -> Source:
    """``entry``'s transport, built by its module (imported now, with its client library)."""
    source: Source = importlib.import_module(entry.module).build(entry, supplies)
    return source


def build(settings: Settings, *, admit: Admit, api: Any = None) -> dict[str, Source]:
    """Every enabled source's transport, by name; nothing runs yet."""
    supplies = Supplies(settings, admit, settings.windows, api)
    return {entry.name: build_one(entry, supplies) for entry in enabled(settings)}


def after_drain(settings: Settings) -> AfterDrain:
    """What the enabled sources must do around a notice's drain, as one part."""
    parts: list[AfterDrain] = [
        importlib.import_module(f"{e.package}.{e.after_drain}").after_drain(e.section(settings))
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
