"""Time formats: RFC 3339 UTC out, every format IMDS ever used in.

IMDS writes ``NotBefore`` as RFC 1123 (``Mon, 11 Apr 2022 22:26:58 GMT``) from api-version 2017-08-01
on, as ISO 8601 (``2016-09-19T18:29:47Z``) in the 2017-03-01 preview, and as ``""`` once an event has
started. Records carry one format only: RFC 3339 in UTC, or null.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime


def rfc3339(epoch: float, millis: bool = True) -> str:
    """Format a Unix time as RFC 3339 UTC (``2026-11-22T09:28:30.123Z``)."""
    t = time.gmtime(epoch)
    base = time.strftime("%Y-%m-%dT%H:%M:%S", t)
    if not millis:
        return base + "Z"
    return f"{base}.{int((epoch % 1) * 1000):03d}Z"


def epoch_of(value: object) -> float | None:
    """A record's RFC 3339 timestamp as Unix time; None when absent or unreadable (a reader of
    records from a stream never fails on one)."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def parse_imds_time(value: str) -> datetime | None:
    """Parse an IMDS timestamp (RFC 1123 or ISO 8601) to an aware UTC datetime.

    Returns ``None`` for the empty string (IMDS's way of saying "no time": the event started) and
    raises ``ValueError`` for anything else it cannot read.
    """
    value = value.strip()
    if not value:
        return None
    if value[:1].isdigit():  # ISO 8601 starts with the year; RFC 1123 with a weekday or a day number
        try:
            dt = datetime.fromisoformat(value)
        except ValueError:
            dt = None
        if dt is not None:
            return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)
    try:
        dt = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError) as exc:
        raise ValueError(f"unrecognised time format: {value[:64]!r}") from exc
    if dt is None:
        raise ValueError(f"unrecognised time format: {value[:64]!r}")
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)


def format_datetime(dt: datetime) -> str:
    """Format an aware datetime as RFC 3339 UTC with second precision (what IMDS times carry)."""
    dt = dt.astimezone(UTC)
    if dt.microsecond:
        return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ")
