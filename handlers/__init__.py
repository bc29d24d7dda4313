"""Source parsers: raw transport payload in, normalized ``Notice``s out.

Each module holds the pure parser of one source (see ``base.Parser`` for the contract and
``README.md`` for the payload each transport hands over) and names it (``NAME``). This
registry maps that name, which a transport is configured with, to the parser; adding a source
is one module here. Transports live elsewhere and only ever call ``parse``.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from datetime import datetime
from types import MappingProxyType

from reclaimd.model import ParseError, ParseOutcome, Windows

from .base import Parser, SavedParser


def _parsers() -> tuple[dict[str, Parser], dict[str, float], dict[str, SavedParser]]:
    """Every module of this package that names a source (``NAME``): its ``parse``, the
    windows it reads with their defaults (``WINDOWS``) and, where it has one, its reading of
    what a user saves (``parse_saved``). The shared readers (base, fields, ids, targets) name
    none."""
    found: dict[str, Parser] = {}
    windows: dict[str, float] = {}
    saved: dict[str, SavedParser] = {}
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        name = getattr(module, "NAME", None)
        if name is None:
            continue
        if name in found:
            raise ImportError(f"handlers: two parsers named {name!r}")
        found[name] = module.parse
        if hasattr(module, "parse_saved"):
            saved[name] = module.parse_saved
        for window, seconds in getattr(module, "WINDOWS", {}).items():
            if windows.setdefault(window, seconds) != seconds:
                raise ImportError(f"handlers: two defaults for window {window!r}")
    return found, windows, saved


_found, _windows, _saved = _parsers()
PARSERS: Mapping[str, Parser] = MappingProxyType(_found)
# The sources whose saved documents are read otherwise than their transport's payload, and
# may name several instances (``reclaimd parse --vm``).
SAVED: Mapping[str, SavedParser] = MappingProxyType(_saved)
# Every parser's windows and their defaults (``Windows``; ``Settings.windows`` offers them).
WINDOWS: Mapping[str, float] = MappingProxyType(dict(sorted(_windows.items())))


def windows(**given: float) -> Windows:
    """Every window, its handler's default unless ``given`` (``default_s`` included)."""
    unknown = sorted(set(given) - set(WINDOWS) - {"default_s"})
    if unknown:
        raise ValueError(f"no window {', '.join(unknown)}; known: {', '.join(WINDOWS)}")
    return Windows(**{**WINDOWS, **given})


_DEFAULT_WINDOWS = windows()


def parse(
    source: str, payload: bytes, *, received_at: datetime, windows: Windows = _DEFAULT_WINDOWS
) -> ParseOutcome:
    """Parse ``payload`` as the named source delivers it; ``ParseError`` for unknown names."""
    parser = PARSERS.get(source)
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
    """What a user saved from the source (``reclaimd parse``): its handler's ``parse_saved``
    where it has one (``target``: the instance to read it for), else its transport's payload
    (no ``target``)."""
    saved = SAVED.get(source)
    if saved is not None:
        return saved(payload, received_at=received_at, windows=windows, target=target)
    if target:
        raise ParseError(f"a {source} payload names its instance: no target to choose")
    return parse(source, payload, received_at=received_at, windows=windows)


__all__ = [
    "PARSERS",
    "SAVED",
    "WINDOWS",
    "Parser",
    "SavedParser",
    "parse",
    "parse_saved",
    "windows",
]
