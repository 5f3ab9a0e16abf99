"""EXE-14: the schedule calendar agrees with an independent brute-force oracle across DST.

Many years (1996-2037) for zones with every kind of transition: Europe/Berlin and
America/New_York (one-hour shifts at 02:00 local, rules changed in 1996 and 2007),
America/Sao_Paulo (shifts at midnight, DST dropped in 2019), Australia/Lord_Howe (30-minute
shifts) and Asia/Tokyo (no DST). Each window is a transition +-30 hours, plus one quiet week a
decade; daily expressions at times inside the zone's gap and overlap, hourly and */15, under
every policy pair.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import cache

import pytest

from services.schedules.domain.calendar import NonexistentPolicy, RepeatedPolicy, firings_between
from tests.unit.schedules.dst_oracle import oracle_firings, transitions

FIRST_YEAR, LAST_YEAR = 1996, 2037
# zone -> a daily expression whose local time falls inside its gaps and overlaps
ZONES = {
    "Europe/Berlin": "30 2 * * *",
    "America/New_York": "30 1 * * *",
    "America/Sao_Paulo": "30 0 * * *",
    "Australia/Lord_Howe": "45 1 * * *",
    "Asia/Tokyo": "30 2 * * *",
}
POLICIES = [(n, r) for n in ("skip", "shift") for r in ("first", "last", "both")]


@cache
def windows(zone: str) -> tuple[tuple[datetime, datetime], ...]:
    found = [
        (t - timedelta(hours=30), t + timedelta(hours=30)) for t in transitions(zone, FIRST_YEAR, LAST_YEAR)
    ]
    found += [
        (datetime(y, 6, 1, tzinfo=UTC), datetime(y, 6, 8, tzinfo=UTC)) for y in range(FIRST_YEAR, 2040, 10)
    ]
    return tuple(found)


def _ms(moment: datetime) -> int:
    return int(moment.timestamp()) * 1000


def _compare(zone: str, expression: str, nonexistent: str, repeated: str, limit: int | None = None) -> int:
    compared = 0
    for start, end in windows(zone)[:limit]:
        expected = oracle_firings(expression, zone, start, end, nonexistent, repeated)
        got = firings_between(
            expression, zone, _ms(start), _ms(end), NonexistentPolicy(nonexistent), RepeatedPolicy(repeated)
        )
        assert got == expected, (zone, expression, nonexistent, repeated, start.isoformat())
        compared += len(expected)
    return compared


def test_the_zones_have_the_transitions_the_test_is_about() -> None:
    """EXE-14: the windows really hold transitions (Tokyo none; Sao Paulo none after 2019)."""
    assert not [t for t in transitions("Asia/Tokyo", FIRST_YEAR, LAST_YEAR)]
    sao_paulo = list(transitions("America/Sao_Paulo", FIRST_YEAR, LAST_YEAR))
    assert sao_paulo and max(sao_paulo).year == 2019
    lord_howe = list(transitions("Australia/Lord_Howe", 2026, 2026))
    assert len(lord_howe) == 2
    assert len(list(transitions("Europe/Berlin", FIRST_YEAR, LAST_YEAR))) == 2 * (LAST_YEAR - FIRST_YEAR + 1)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("zone", sorted(ZONES))
def test_daily_inside_the_transitions_matches_the_oracle_for_every_policy_EXE_14(zone: str) -> None:
    total = sum(_compare(zone, ZONES[zone], n, r) for n, r in POLICIES)
    assert total > 100


@pytest.mark.timeout(120)
@pytest.mark.parametrize("zone", sorted(ZONES))
@pytest.mark.parametrize("expression", ["0 * * * *", "*/15 * * * *"])
def test_hourly_and_quarter_hourly_match_the_oracle_EXE_14(zone: str, expression: str) -> None:
    # Every policy pair on the first decade of windows; the defaults on all of them.
    for n, r in POLICIES:
        _compare(zone, expression, n, r, limit=10)
    assert _compare(zone, expression, "skip", "first") > 100


def test_the_seed_rule_berlin_2026_EXE_14() -> None:
    """02:30 does not exist on 29 March 2026 (skipped) and occurs twice on 25 October (once)."""
    start, end = datetime(2026, 3, 28, tzinfo=UTC), datetime(2026, 3, 31, tzinfo=UTC)
    spring = firings_between("30 2 * * *", "Europe/Berlin", _ms(start), _ms(end))
    assert [datetime.fromtimestamp(t / 1000, UTC).isoformat() for t in spring] == [
        "2026-03-28T01:30:00+00:00",
        "2026-03-30T00:30:00+00:00",
    ]
    start, end = datetime(2026, 10, 24, 12, tzinfo=UTC), datetime(2026, 10, 25, 12, tzinfo=UTC)
    autumn = firings_between("30 2 * * *", "Europe/Berlin", _ms(start), _ms(end))
    assert [datetime.fromtimestamp(t / 1000, UTC).isoformat() for t in autumn] == [
        "2026-10-25T00:30:00+00:00"
    ]
