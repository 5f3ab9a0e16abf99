"""An independent oracle for schedule firings across DST (EXE-14): brute force, minute by minute.

It shares no code with services/schedules: its own cron-field parser, its own matching (Vixie
cron's day rule: when both day-of-month and day-of-week are restricted, either may match), and
its own reading of the policies. It walks UTC minute by minute, converts each minute to local
time with zoneinfo and asks whether the local reading matches:
  * a reading that occurs once fires;
  * a repeated reading (zoneinfo sets fold=1 on the second occurrence) fires at the first, the
    last, or both occurrences, as the policy says;
  * readings inside a gap never appear in the walk; with "shift", a matching reading in the gap
    between the minute before a forward jump and the minute of it fires once, at that minute.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

__all__ = ["OracleCron", "oracle_firings", "transitions"]

_NAMES = {
    "jan": 1, "feb": 2, "mar": 3, "apr": 4, "may": 5, "jun": 6,
    "jul": 7, "aug": 8, "sep": 9, "oct": 10, "nov": 11, "dec": 12,
    "sun": 0, "mon": 1, "tue": 2, "wed": 3, "thu": 4, "fri": 5, "sat": 6,
}  # fmt: skip


def _field(text: str, low: int, high: int) -> frozenset[int]:
    values: set[int] = set()
    for part in text.lower().split(","):
        step = 1
        if "/" in part:
            part, step_text = part.split("/")
            step = int(step_text)
        if part == "*":
            first, last = low, high
        elif "-" in part:
            a, b = part.split("-")
            first, last = int(_NAMES.get(a, a)), int(_NAMES.get(b, b))
        else:
            first = int(_NAMES.get(part, part))
            last = high if step != 1 else first
        values.update(range(first, last + 1, step))
    return frozenset(values)


@dataclass(frozen=True)
class OracleCron:
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    day_star: bool
    weekday_star: bool

    @classmethod
    def parse(cls, expression: str) -> OracleCron:
        m, h, dom, mon, dow = expression.split()
        weekdays = frozenset(d % 7 for d in _field(dow, 0, 7))  # 7 is Sunday too
        return cls(
            _field(m, 0, 59),
            _field(h, 0, 23),
            _field(dom, 1, 31),
            _field(mon, 1, 12),
            weekdays,
            dom.startswith("*"),
            dow.startswith("*"),
        )

    def matches(self, local: datetime) -> bool:
        if local.minute not in self.minutes or local.hour not in self.hours or local.month not in self.months:
            return False
        day_ok = local.day in self.days
        weekday_ok = (local.isoweekday() % 7) in self.weekdays
        if self.day_star or self.weekday_star:
            return day_ok and weekday_ok
        return day_ok or weekday_ok


def _ms(moment: datetime) -> int:
    return int(moment.timestamp()) * 1000


def oracle_firings(
    expression: str, zone_name: str, start: datetime, end: datetime, nonexistent: str, repeated: str
) -> list[int]:
    """Firings in (start, end] (UTC, whole minutes), epoch ms, by walking every minute."""
    cron, zone = OracleCron.parse(expression), ZoneInfo(zone_name)
    found: list[int] = []
    minute = timedelta(minutes=1)
    moment = start.astimezone(UTC)
    previous_local = moment.astimezone(zone).replace(tzinfo=None)
    while moment < end:
        moment += minute
        aware = moment.astimezone(zone)
        local = aware.replace(tzinfo=None)
        if nonexistent == "shift" and local - previous_local > minute:
            gap = previous_local + minute
            while gap < local:
                if cron.matches(gap):
                    found.append(_ms(moment))
                    break
                gap += minute
        previous_local = local
        if not cron.matches(local):
            continue
        other = aware.replace(fold=1 - aware.fold).astimezone(UTC)
        repeated_reading = other != moment and other.astimezone(zone).replace(tzinfo=None) == local
        if not repeated_reading or repeated == "both" or (repeated == "first") == (aware.fold == 0):
            found.append(_ms(moment))
    return sorted(set(found))


def transitions(zone_name: str, first_year: int, last_year: int) -> Iterable[datetime]:
    """Instants (to the hour) where the zone's offset changes: found by sampling every hour."""
    zone = ZoneInfo(zone_name)
    moment = datetime(first_year, 1, 1, tzinfo=UTC)
    end = datetime(last_year + 1, 1, 1, tzinfo=UTC)
    hour = timedelta(hours=1)
    before = moment.astimezone(zone).utcoffset()
    while moment < end:
        moment += hour
        now = moment.astimezone(zone).utcoffset()
        if now != before:
            yield moment
        before = now
