"""EXE-14: a hypothesis property: random cron expressions, zones and dates, calendar == oracle."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from services.schedules.domain.calendar import NonexistentPolicy, RepeatedPolicy, firings_between, next_firing
from tests.unit.schedules.dst_oracle import oracle_firings

ZONES = [
    "Europe/Berlin", "America/New_York", "America/Sao_Paulo", "Australia/Lord_Howe", "Asia/Tokyo",
    "Pacific/Chatham", "America/St_Johns", "Europe/Dublin", "Asia/Tehran", "UTC",
]  # fmt: skip


def _part(low: int, high: int) -> st.SearchStrategy[str]:
    number = st.integers(low, high)
    return st.one_of(
        st.just("*"),
        number.map(str),
        st.integers(2, max(2, (high - low) // 2)).map(lambda s: f"*/{s}"),
        st.tuples(number, number).map(lambda ab: f"{min(ab)}-{max(ab)}"),
        st.lists(number, min_size=2, max_size=3, unique=True).map(lambda xs: ",".join(map(str, sorted(xs)))),
    )


expressions = st.tuples(
    _part(0, 59), _part(0, 23), st.one_of(st.just("*"), _part(1, 28)), st.just("*"), _part(0, 6)
).map(" ".join)
# Around the last Sunday of March and October, the first of April and November, or any day.
starts = st.one_of(
    st.builds(datetime, st.integers(1998, 2035), st.sampled_from([3, 4, 9, 10, 11]), st.integers(1, 28),
              st.integers(0, 23), tzinfo=st.just(UTC)),
    st.datetimes(datetime(1990, 1, 1), datetime(2037, 12, 1), timezones=st.just(UTC)).map(
        lambda d: d.replace(second=0, microsecond=0)
    ),
)  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(
    expression=expressions,
    zone=st.sampled_from(ZONES),
    start=starts,
    hours=st.integers(1, 60),
    nonexistent=st.sampled_from(["skip", "shift"]),
    repeated=st.sampled_from(["first", "last", "both"]),
)
def test_random_expressions_zones_and_ranges_match_the_oracle_EXE_14(
    expression: str, zone: str, start: datetime, hours: int, nonexistent: str, repeated: str
) -> None:
    end = start + timedelta(hours=hours)
    after, until = int(start.timestamp()) * 1000, int(end.timestamp()) * 1000
    expected = oracle_firings(expression, zone, start, end, nonexistent, repeated)
    policies = NonexistentPolicy(nonexistent), RepeatedPolicy(repeated)
    assert firings_between(expression, zone, after, until, *policies) == expected
    following = next_firing(expression, zone, after, *policies)
    if expected:
        assert following == expected[0]
    else:
        assert following is None or following > until
