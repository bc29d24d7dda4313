"""The contract's times: RFC 3339 on the wire, aware UTC datetimes in the code.

The controller reads and writes the same times (its ``reclaimd.model`` re-exports these), so
there is one reading of a deadline on both sides of a checkpoint request.
"""

from __future__ import annotations

from datetime import UTC, datetime


class ParseError(ValueError):
    """A payload that cannot be read as what its transport promised. Never retried."""


def utcnow() -> datetime:
    return datetime.now(UTC)


def rfc3339(t: datetime) -> str:
    """UTC, second precision unless the time has a fraction (kept whole), always with ``Z``."""
    t = t.astimezone(UTC)
    # isoformat pads the year to four digits, where strftime("%Y") does not on every libc.
    return (
        t.replace(tzinfo=None).isoformat(timespec="microseconds" if t.microsecond else "seconds")
        + "Z"
    )


def parse_time(value: str) -> datetime:
    """RFC 3339 in, aware UTC datetime out. Raises ``ParseError``."""
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        t = datetime.fromisoformat(text)
    except ValueError as e:
        raise ParseError(f"not an RFC 3339 time: {value[:40]!r}") from e
    if t.tzinfo is None:
        raise ParseError(f"time without a zone: {value[:40]!r}")
    try:
        return t.astimezone(UTC)
    except OverflowError as e:
        raise ParseError(f"time out of range: {value[:40]!r}") from e
