"""Typed reads from decoded JSON, each failing with a one-line ``ParseError``.

Every parser reads its payload through these helpers, so a missing key, a wrong type, a bad
time or an out-of-range deadline becomes a ``ParseError`` and never a ``KeyError``,
``TypeError``, ``RecursionError`` or ``OverflowError``. That matters beyond tidiness: the
intake acks and counts a ``ParseError``, while any other exception looks transient and would
redeliver a poison message for ever.

Names in messages are dotted paths (``detail.instance-id``) and values are shown truncated
through ``repr``, so a message stays on one line whatever the payload holds.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from reclaimd.handlers.ids import Grammar
from reclaimd.model import ParseError, frozen_map, load_json, parse_time

JSONObject = Mapping[str, Any]
_EARLIEST_YEAR = 1970
# How far past its receipt a notice may say it was issued: clock skew and a replayed
# sample, not the future. A notice "issued" in 2999 would hold its claim (and a graceful stop)
# for centuries.
MAX_SKEW_S = 86_400.0

_MONTHS = {
    m: i + 1
    for i, m in enumerate(
        ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
    )
}
# "21 Jan 2019 09:00:43 GMT" (IMDS scheduled events) and "Wed, 15 Jan 2025 12:00:00 GMT"
# (AWS Health). Parsed by hand rather than with strptime so the result does not depend on
# the process locale.
_GMT_TIME = re.compile(
    r"(?:[A-Za-z]{3}, *)?([0-9]{1,2}) ([A-Za-z]{3}) ([0-9]{4}) "
    r"([0-9]{2}):([0-9]{2}):([0-9]{2}) GMT"
)


def show(value: object, limit: int = 40) -> str:
    """A bounded, single-line rendering of a payload value for an error message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _kind(value: object) -> str:
    if value is None:
        return "null"
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), "a number"
    )


def load(payload: bytes | str) -> Any:
    """JSON, or a ``ParseError`` (nesting deep enough to exhaust the stack included)."""
    return load_json(payload)


def as_object(value: Any, name: str) -> JSONObject:
    if not isinstance(value, dict):
        raise ParseError(f"{name}: expected an object, got {_kind(value)}")
    return value


def as_list(value: Any, name: str) -> list[Any]:
    if not isinstance(value, list):
        raise ParseError(f"{name}: expected a list, got {_kind(value)}")
    return value


def as_text(value: Any, name: str) -> str:
    """A non-blank string that can be encoded (ids and attributes are hashed and logged)."""
    if not isinstance(value, str):
        raise ParseError(f"{name}: expected a string, got {_kind(value)}")
    if not value.strip():
        raise ParseError(f"{name}: empty")
    try:
        value.encode()
    except UnicodeEncodeError as e:
        raise ParseError(f"{name}: not valid Unicode text") from e
    return value


def _name(at: str, key: str) -> str:
    return f"{at}.{key}" if at else key


def member(obj: JSONObject, key: str, *, at: str = "") -> Any:
    if key not in obj or obj[key] is None:
        raise ParseError(f"{_name(at, key)}: missing")
    return obj[key]


def text(obj: JSONObject, key: str, *, at: str = "") -> str:
    return as_text(member(obj, key, at=at), _name(at, key))


def opt_text(obj: JSONObject, key: str, *, at: str = "") -> str:
    """An optional string member: absent, null and blank all read as ``""``."""
    value = obj.get(key)
    if value is None or (isinstance(value, str) and not value.strip()):
        return ""
    return as_text(value, _name(at, key))


def ident(obj: JSONObject, key: str, grammar: Grammar, *, at: str = "") -> str:
    """A required identifier, checked against its provider's grammar (``ids``)."""
    return grammar.check(text(obj, key, at=at), _name(at, key))


def opt_ident(obj: JSONObject, key: str, grammar: Grammar, *, at: str = "") -> str:
    """An optional identifier: ``""`` when absent or blank, else checked like ``ident``."""
    value = opt_text(obj, key, at=at)
    return grammar.check(value, _name(at, key)) if value else ""


def sub(obj: JSONObject, key: str, *, at: str = "") -> JSONObject:
    return as_object(member(obj, key, at=at), _name(at, key))


def opt_sub(obj: JSONObject, key: str, *, at: str = "") -> JSONObject:
    value = obj.get(key)
    return {} if value is None else as_object(value, _name(at, key))


def items(obj: JSONObject, key: str, *, at: str = "") -> list[Any]:
    return as_list(member(obj, key, at=at), _name(at, key))


def opt_items(obj: JSONObject, key: str, *, at: str = "") -> list[Any]:
    value = obj.get(key)
    return [] if value is None else as_list(value, _name(at, key))


def _plausible(t: datetime, raw: str, name: str) -> datetime:
    # No notice predates the epoch; refusing such times also keeps every notice storable,
    # since four-digit years are what RFC 3339 (and so a stored claim) can write.
    if t.year < _EARLIEST_YEAR:
        raise ParseError(f"{name}: time out of range: {show(raw)}")
    return t


def as_time(value: Any, name: str) -> datetime:
    """An RFC 3339 time with a zone, as an aware UTC datetime."""
    raw = as_text(value, name)
    try:
        t = parse_time(raw)
    except ParseError as e:
        raise ParseError(f"{name}: {e}") from e
    except OverflowError as e:  # a valid offset that moves the time past year 1 or 9999
        raise ParseError(f"{name}: time out of range: {show(raw)}") from e
    return _plausible(t, raw, name)


def time(obj: JSONObject, key: str, *, at: str = "") -> datetime:
    return as_time(member(obj, key, at=at), _name(at, key))


def as_gmt_time(value: Any, name: str) -> datetime:
    """``[Wed, ]21 Jan 2019 09:00:43 GMT`` as an aware UTC datetime."""
    raw = as_text(value, name)
    match = _GMT_TIME.fullmatch(raw.strip())
    month = _MONTHS.get(match.group(2).title()) if match else None
    if match is None or month is None:
        raise ParseError(f"{name}: not a 'DD Mon YYYY hh:mm:ss GMT' time: {show(raw)}")
    day, year, hour, minute, second = (int(match.group(i)) for i in (1, 3, 4, 5, 6))
    try:
        t = datetime(year, month, day, hour, minute, second, tzinfo=UTC)
    except ValueError as e:
        raise ParseError(f"{name}: no such time: {show(raw)}") from e
    return _plausible(t, raw, name)


def issued(t: datetime, received_at: datetime, name: str) -> datetime:
    """``t``, the time a notice says it was issued, unless it is later than its receipt by
    more than clock skew (``MAX_SKEW_S``): then a ``ParseError``."""
    if t > received_at + timedelta(seconds=MAX_SKEW_S):
        raise ParseError(f"{name}: issued in the future: {t.isoformat()}")
    return t


def plus(t: datetime, seconds: float) -> datetime:
    """``t`` + ``seconds``, as a ``ParseError`` when the sum leaves the datetime range."""
    try:
        return t + timedelta(seconds=seconds)
    except (OverflowError, ValueError) as e:  # ValueError: a NaN window
        raise ParseError(f"deadline out of range: {t.isoformat()} + {seconds}s") from e


def attributes(pairs: Mapping[str, str]) -> Mapping[str, str]:
    """Notice attributes without the empty ones (absent is clearer than ``""``)."""
    return frozen_map({k: v for k, v in pairs.items() if v})
