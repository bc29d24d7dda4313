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

from .base import Parser


def _parsers() -> dict[str, Parser]:
    """Every module of this package that names a source (``NAME``) and its ``parse``; the
    shared readers (base, fields, ids, targets) name none."""
    found: dict[str, Parser] = {}
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        name = getattr(module, "NAME", None)
        if name is not None:
            if name in found:
                raise ImportError(f"handlers: two parsers named {name!r}")
            found[name] = module.parse
    return found


PARSERS: Mapping[str, Parser] = MappingProxyType(_parsers())


_DEFAULT_WINDOWS = Windows()


def parse(
    source: str, payload: bytes, *, received_at: datetime, windows: Windows = _DEFAULT_WINDOWS
) -> ParseOutcome:
    """Parse ``payload`` as the named source delivers it; ``ParseError`` for unknown names."""
    parser = PARSERS.get(source)
    if parser is None:
        raise ParseError(f"unknown source {source!r}; known: {', '.join(sorted(PARSERS))}")
    return parser(payload, received_at=received_at, windows=windows)


__all__ = ["PARSERS", "Parser", "parse"]
