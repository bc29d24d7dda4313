"""The one contract every source parser keeps.

A parser is a pure function from the raw bytes a transport received to a ``ParseOutcome``:
one or more ``Notice``s, ``Ignored`` for a well-formed payload that is no notice, or a raised
``ParseError`` (one line) for a payload that cannot be read. It raises nothing else for any
input, does no I/O and reads no clock: the transport passes ``received_at`` in, so the same
bytes at the same time always give the same outcome and a redelivery maps to the same ids.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from reclaimd.model import ParseOutcome, Windows


class Parser(Protocol):
    def __call__(
        self, payload: bytes, *, received_at: datetime, windows: Windows
    ) -> ParseOutcome: ...


class SavedParser(Protocol):
    """A handler's reading of what a user saved from the source itself (``reclaimd parse``),
    where that differs from its transport's payload (``parse_saved``): ``target`` names the
    instance a document that lists several is read for ("": every one it names)."""

    def __call__(
        self, payload: bytes, *, received_at: datetime, windows: Windows, target: str = ""
    ) -> ParseOutcome: ...
