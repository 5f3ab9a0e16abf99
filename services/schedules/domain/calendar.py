"""When a schedule fires: a cron expression stepped in an IANA zone, with the DST policies (EXE-14).

cronsim (the library) parses the expression and steps it over NAIVE wall-clock times: it knows
nothing of zones, so every local time it yields is a wall-clock reading that may occur zero,
one or two times in the zone. Mapping those readings to UTC instants is the only part written
here, because that is exactly where every library (cronsim with an aware datetime, croniter,
hashicorp/cronexpr) differs from the rule EXE-14 sets: croniter and cronexpr run a repeated hour
twice and drop or move a skipped one without telling. The policies, per schedule:

  nonexistent local time (spring forward):  "skip" (default, the seed's rule) - no firing;
                                            "shift" - fire at the first valid instant after
                                            the gap (the transition itself: 02:30 -> 03:00).
  repeated local time (fall back):          "first" (default, the seed's rule), "last", "both".

Several skipped readings shifted into one gap fire once (one instant, one key). Instants are
epoch milliseconds in UTC; pure functions, no clock.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

__all__ = [
    "MAX_LOOKAHEAD_DAYS",
    "CalendarError",
    "NonexistentPolicy",
    "RepeatedPolicy",
    "firings_between",
    "next_firing",
    "next_firings",
    "validate_cron",
    "validate_zone",
    "zone_of",
]

# A cron expression that matches nothing for this long (e.g. "0 0 30 2 *") never fires.
MAX_LOOKAHEAD_DAYS = 5 * 366
_MINUTE = timedelta(minutes=1)
# Offsets are sampled this often across a window: every offset period in tzdata lasts longer.
_SAMPLE = timedelta(minutes=30)


class NonexistentPolicy(StrEnum):
    SKIP = "skip"
    SHIFT = "shift"


class RepeatedPolicy(StrEnum):
    FIRST = "first"
    LAST = "last"
    BOTH = "both"


class CalendarError(ValueError):
    """An expression or zone that cannot be used; `field` names the request field at fault."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(detail)
        self.field = field
        self.detail = detail


@lru_cache(maxsize=512)
def zone_of(name: str) -> ZoneInfo:
    try:
        if not name or name != name.strip() or name.startswith("/") or ".." in name:
            raise ValueError(name)
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise CalendarError("timeZone", f"{name!r} is not an IANA time zone (e.g. Europe/Berlin)") from exc


def validate_zone(name: str) -> None:
    zone_of(name)


@lru_cache(maxsize=4096)
def validate_cron(expression: str) -> str:
    """The expression if cronsim accepts it as five fields (minute precision), else CalendarError."""
    fields = expression.split()
    if len(fields) != 5:
        raise CalendarError(
            "cron", f"a cron expression has 5 fields (minute hour day month weekday), got {len(fields)}"
        )
    try:
        CronSim(expression, datetime(2000, 1, 1))
    except CronSimError as exc:
        raise CalendarError("cron", f"{expression!r} is not a valid cron expression: {exc}") from exc
    return expression


def _utc(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def _valid(local: datetime, zone: ZoneInfo) -> list[datetime]:
    """The UTC instants whose wall-clock reading in `zone` is `local` (0, 1 or 2 of them)."""
    found: list[datetime] = []
    for fold in (0, 1):
        moment = local.replace(tzinfo=zone, fold=fold).astimezone(UTC)
        if moment.astimezone(zone).replace(tzinfo=None) == local and moment not in found:
            found.append(moment)
    return sorted(found)


def _gap_end(local: datetime, zone: ZoneInfo) -> datetime:
    """The first instant after the gap `local` falls in: the transition, found by bisection
    between the two readings zoneinfo offers for a nonexistent time (fold 1 and fold 0)."""
    low = local.replace(tzinfo=zone, fold=1).astimezone(UTC)
    high = local.replace(tzinfo=zone, fold=0).astimezone(UTC)
    low, high = min(low, high), max(low, high)
    before = low.astimezone(zone).utcoffset()
    while high - low > timedelta(seconds=1):
        middle = low + (high - low) / 2
        if middle.astimezone(zone).utcoffset() == before:
            low = middle
        else:
            high = middle
    return high.replace(microsecond=0)


def _instants(
    local: datetime, zone: ZoneInfo, nonexistent: NonexistentPolicy, repeated: RepeatedPolicy
) -> list[datetime]:
    found = _valid(local, zone)
    if not found:
        return [_gap_end(local, zone)] if nonexistent is NonexistentPolicy.SHIFT else []
    if len(found) == 1 or repeated is RepeatedPolicy.BOTH:
        return found
    return [found[0]] if repeated is RepeatedPolicy.FIRST else [found[-1]]


def _naive_bounds(start: datetime, end: datetime, zone: ZoneInfo) -> tuple[datetime, datetime]:
    """Wall-clock readings that instants in (start, end] can have: the window widened by the
    smallest and largest offset in force anywhere in it (sampled every 30 minutes)."""
    offsets = set()
    probe = start
    while True:
        offset = probe.astimezone(zone).utcoffset()
        assert offset is not None
        offsets.add(offset)
        if probe >= end:
            break
        probe = min(probe + _SAMPLE, end)
    return (start + min(offsets)).replace(tzinfo=None) - _MINUTE, (end + max(offsets)).replace(tzinfo=None)


def _between(
    expression: str,
    zone: ZoneInfo,
    start: datetime,
    end: datetime,
    nonexistent: NonexistentPolicy,
    repeated: RepeatedPolicy,
) -> list[datetime]:
    low, high = _naive_bounds(start, end, zone)
    found: set[datetime] = set()
    for local in CronSim(expression, low):
        if local > high:
            break
        for moment in _instants(local, zone, nonexistent, repeated):
            if start < moment <= end:
                found.add(moment)
    return sorted(found)


def firings_between(
    expression: str,
    zone_name: str,
    after_ms: int,
    until_ms: int,
    nonexistent: NonexistentPolicy = NonexistentPolicy.SKIP,
    repeated: RepeatedPolicy = RepeatedPolicy.FIRST,
) -> list[int]:
    """Every firing instant in (after_ms, until_ms], ascending, in UTC epoch milliseconds."""
    if until_ms <= after_ms:
        return []
    moments = _between(
        validate_cron(expression), zone_of(zone_name), _utc(after_ms), _utc(until_ms), nonexistent, repeated
    )
    return [_ms(m) for m in moments]


def _windows(after: datetime) -> Iterator[tuple[datetime, datetime]]:
    # Small windows first: an every-minute schedule pays for minutes, a yearly one for a year.
    start, width = after, timedelta(minutes=5)
    limit = after + timedelta(days=MAX_LOOKAHEAD_DAYS)
    while start < limit:
        end = min(start + width, limit)
        yield start, end
        start, width = end, width * 4


def next_firing(
    expression: str,
    zone_name: str,
    after_ms: int,
    nonexistent: NonexistentPolicy = NonexistentPolicy.SKIP,
    repeated: RepeatedPolicy = RepeatedPolicy.FIRST,
) -> int | None:
    """The first firing strictly after `after_ms`, or None if there is none within ~5 years."""
    expression, zone = validate_cron(expression), zone_of(zone_name)
    for start, end in _windows(_utc(after_ms)):
        found = _between(expression, zone, start, end, nonexistent, repeated)
        if found:
            return _ms(found[0])
    return None


def next_firings(
    expression: str,
    zone_name: str,
    after_ms: int,
    count: int,
    nonexistent: NonexistentPolicy = NonexistentPolicy.SKIP,
    repeated: RepeatedPolicy = RepeatedPolicy.FIRST,
) -> list[int]:
    """The next `count` firings strictly after `after_ms`."""
    found: list[int] = []
    at = after_ms
    while len(found) < count:
        following = next_firing(expression, zone_name, at, nonexistent, repeated)
        if following is None:
            break
        found.append(following)
        at = following
    return found
