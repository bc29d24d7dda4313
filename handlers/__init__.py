"""Source parsers: raw transport payload in, normalized ``Notice``s out.

Each module holds the pure parser of one source (see ``base.Parser`` for the contract and
``README.md`` for the payload each transport hands over). This registry maps the source
name a transport is configured with to its parser; adding a source is one module and one
line here. Transports live elsewhere and only ever call ``parse``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from types import MappingProxyType

from reclaimd.model import ParseError, ParseOutcome, Windows

from . import ec2_spot, gce_metadata, gke_preemption, imds, kafka_notice, kueue_reclaim
from .base import Parser

PARSERS: Mapping[str, Parser] = MappingProxyType(
    {
        "ec2": ec2_spot.parse,
        "imds": imds.parse,
        "gke": gke_preemption.parse,
        "gce-metadata": gce_metadata.parse,
        "kueue": kueue_reclaim.parse,
        "kafka": kafka_notice.parse,
    }
)


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
