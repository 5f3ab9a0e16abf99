"""THE one rendering of a time as RFC 3339 (issue 17): epoch milliseconds in, text out.

Tenure records times as epoch milliseconds (Avro longs, `<x>At` fields); people and other tools
read RFC 3339. Every place that shows a time (the CLI, the console, the API's views, the schedule
and watchdog views, the runner host's reports) renders it here, so they all agree to the
millisecond: `2026-12-01T19:15:09.123Z`, UTC with a Z unless a zone is asked for.

Pure: no clock is read, so the domain packages may import it. The arithmetic is on integers
(a timedelta of whole milliseconds), never a float of seconds, so what is shown is exactly the
millisecond recorded, for every time a `datetime` can hold.

RFC 3339 has four-digit years only: a time outside 0001-01-01T00:00:00.000Z ..
9999-12-31T23:59:59.999Z (an Avro long can hold far more) has no RFC 3339 text. `rfc3339`
refuses it with a ValueError that says so; `rfc3339_or_none` answers None, for the callers that
render whatever a record holds and must never fail on it (the API's views, the CLI).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, tzinfo
from typing import Literal

__all__ = ["MAX_RFC3339_MS", "MIN_RFC3339_MS", "Timespec", "parse_rfc3339_ms", "rfc3339", "rfc3339_or_none"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# The first and last millisecond that a datetime (and a four-digit RFC 3339 year) can hold.
_MS = timedelta(milliseconds=1)
MIN_RFC3339_MS = (datetime(1, 1, 1, tzinfo=UTC) - _EPOCH) // _MS  # -62135596800000
MAX_RFC3339_MS = (datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC) - _EPOCH) // _MS  # 253402300799999

Timespec = Literal["seconds", "milliseconds"]


def rfc3339(ms: int, zone: tzinfo | None = None, *, timespec: Timespec = "milliseconds") -> str:
    """`ms` (epoch milliseconds) as RFC 3339: UTC with a Z, e.g. 2026-12-01T19:15:09.123Z.

    `zone`: the local time there with its offset (2026-03-29T03:30:00+02:00), for a schedule's
    own zone; an offset of zero is then written +00:00, as that zone's time, not as UTC's Z.
    `timespec="seconds"` drops the milliseconds (the schedules' firing keys and views).
    ValueError for a time outside MIN_RFC3339_MS..MAX_RFC3339_MS (no four-digit year)."""
    if not MIN_RFC3339_MS <= ms <= MAX_RFC3339_MS:
        raise ValueError(
            f"{ms} ms since the epoch is outside what RFC 3339 can write "
            f"({MIN_RFC3339_MS}..{MAX_RFC3339_MS}: the years 0001 to 9999)"
        )
    moment = _EPOCH + ms * _MS
    if zone is None:
        return moment.isoformat(timespec=timespec).replace("+00:00", "Z")
    try:
        return moment.astimezone(zone).isoformat(timespec=timespec)
    except OverflowError as exc:  # within a day of year 1 or 9999, the zone's offset overflows
        raise ValueError(f"{ms} ms since the epoch is outside what RFC 3339 can write in {zone}") from exc


def rfc3339_or_none(
    ms: int, zone: tzinfo | None = None, *, timespec: Timespec = "milliseconds"
) -> str | None:
    """`rfc3339`, or None for a time that has no RFC 3339 text (instead of raising)."""
    try:
        return rfc3339(ms, zone, timespec=timespec)
    except ValueError:
        return None


def parse_rfc3339_ms(text: str) -> int:
    """The epoch milliseconds of an RFC 3339 text (Z or an offset); the inverse of `rfc3339`.

    ValueError for a text that is not one, or that names no zone (RFC 3339 always does)."""
    moment = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    if moment.tzinfo is None:
        raise ValueError(f"{text[:60]!r} has no offset or Z: RFC 3339 always names one")
    return (moment - _EPOCH) // _MS
