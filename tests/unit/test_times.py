"""THE one RFC 3339 rendering (services/common/times.py, issue 17) and the callers that use it.

The function is exact to the millisecond for every time a datetime can hold (parse it back and
the same epoch ms come out), refuses clearly what RFC 3339 cannot write (years beyond 0001-9999:
an Avro long holds far more), and each former copy keeps the text it gave before: the CLI's,
the console's, the watchdog view's, the kcat export's and the breakers' milliseconds with a Z,
the schedules' seconds (in UTC or their own zone) and the runner host's seconds-float input.
"""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from services.common.times import (
    MAX_RFC3339_MS,
    MIN_RFC3339_MS,
    parse_rfc3339_ms,
    rfc3339,
    rfc3339_or_none,
)

pytestmark = pytest.mark.timeout(60)

AVRO_LONG_MAX = 2**63 - 1
AVRO_LONG_MIN = -(2**63)
MS = st.integers(MIN_RFC3339_MS, MAX_RFC3339_MS)


def _old(ms: int) -> str:
    """What the copies did (services/*: fromtimestamp, isoformat, +00:00 -> Z)."""
    moment = dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def test_a_time_is_utc_with_milliseconds_and_a_z() -> None:
    assert rfc3339(1_796_152_509_123) == "2026-12-01T19:15:09.123Z"
    assert rfc3339(1_796_152_509_000) == "2026-12-01T19:15:09.000Z"
    assert rfc3339(1_796_152_509_123, timespec="seconds") == "2026-12-01T19:15:09Z"


def test_the_boundaries_epoch_first_and_last_millisecond() -> None:
    assert rfc3339(0) == "1970-01-01T00:00:00.000Z"
    assert rfc3339(-1) == "1969-12-31T23:59:59.999Z"
    assert rfc3339(MAX_RFC3339_MS) == "9999-12-31T23:59:59.999Z"
    assert rfc3339(MIN_RFC3339_MS) == "0001-01-01T00:00:00.000Z"
    assert (MIN_RFC3339_MS, MAX_RFC3339_MS) == (-62_135_596_800_000, 253_402_300_799_999)


@pytest.mark.parametrize("ms", [MAX_RFC3339_MS + 1, AVRO_LONG_MAX, MIN_RFC3339_MS - 1, AVRO_LONG_MIN])
def test_a_time_beyond_year_9999_or_before_year_1_is_refused_clearly_or_none(ms: int) -> None:
    with pytest.raises(ValueError, match="outside what RFC 3339 can write"):
        rfc3339(ms)
    assert rfc3339_or_none(ms) is None
    assert rfc3339_or_none(ms, ZoneInfo("Asia/Tokyo")) is None


def test_a_zone_near_the_last_day_refuses_rather_than_overflowing() -> None:
    # 9999-12-31T23:00Z is 10000-01-01 in Tokyo: no four-digit year, so no text (not an OverflowError).
    with pytest.raises(ValueError):
        rfc3339(MAX_RFC3339_MS - 3_600_000, ZoneInfo("Asia/Tokyo"))


@given(MS)
def test_parsing_the_text_back_gives_the_same_milliseconds(ms: int) -> None:
    text = rfc3339(ms)
    assert len(text) == 24 and text.endswith("Z")
    assert parse_rfc3339_ms(text) == ms


@given(MS, st.sampled_from(["Europe/Berlin", "America/St_Johns", "Asia/Kathmandu", "Europe/London"]))
def test_a_zone_shows_the_same_instant_with_its_offset(ms: int, zone: str) -> None:
    text = rfc3339_or_none(ms, ZoneInfo(zone))
    if text is not None:  # a day from either end the zone's local year leaves 0001-9999
        assert not text.endswith("Z")
        assert parse_rfc3339_ms(text) == ms


@given(st.integers(-4_102_444_800_000, 4_102_444_800_000))
def test_it_renders_what_the_copies_rendered_for_1840_to_2100(ms: int) -> None:
    # The copies divided by 1000 into a float of seconds: exact enough here, not everywhere
    # (9359038666748 ms, in 2266, came out one millisecond early); the integer arithmetic is.
    assert rfc3339(ms) == _old(ms)


def test_it_is_exact_where_a_float_of_seconds_was_not() -> None:
    assert _old(9_359_038_666_748) == "2266-07-30T04:57:46.747Z"
    assert rfc3339(9_359_038_666_748) == "2266-07-30T04:57:46.748Z"


def test_parse_refuses_a_text_without_a_zone() -> None:
    with pytest.raises(ValueError, match="no offset"):
        parse_rfc3339_ms("2026-12-01T19:15:09.123")
    assert parse_rfc3339_ms("2026-12-01T20:15:09.123+01:00") == 1_796_152_509_123


# --- the former copies, now callers ---------------------------------------------------------------


def test_the_schedules_keep_seconds_in_utc_and_in_their_zone() -> None:
    from services.schedules.domain.decide import firing_key, idempotency_key
    from services.schedules.view import rfc3339 as schedule_time

    at = 1_774_834_200_000  # 2026-03-30T01:30:00Z
    assert schedule_time(at) == "2026-03-30T01:30:00Z"
    assert schedule_time(at, "Europe/Berlin") == "2026-03-30T03:30:00+02:00"
    assert schedule_time(1_767_231_000_000, "Europe/London") == "2026-01-01T01:30:00+00:00"  # a zone, not Z
    assert firing_key("sch_1", at) == "sch_1/2026-03-30T01:30:00Z"
    assert idempotency_key("sch_1", at).endswith(":sch_1:2026-03-30T01:30:00Z")


@given(st.floats(0, 4 * 10**9, allow_nan=False))
@example(562_949_953.6159995)  # x 1e6 as a float is ...615999.5: rounding that again gave .616
def test_the_runner_host_renders_a_seconds_float_as_it_did(epoch_s: float) -> None:
    from services.runner_host.control import rfc3339 as host_time

    old = dt.datetime.fromtimestamp(epoch_s, dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    assert host_time(epoch_s) == old


def test_the_cli_console_kcat_watchdog_and_breakers_share_it() -> None:
    from services.command_api.console.render import rfc3339 as console_time
    from services.command_api.routes_breakers import _rfc3339 as breaker_time
    from services.projections.watchdog_views import rfc3339 as watchdog_time
    from services.quarantine.view import iso as quarantine_time
    from services.tenure_cli.api_client import rfc3339 as cli_time
    from services.tenure_cli.kcat import flatten
    from services.tenure_cli.kcat import rfc3339 as kcat_time

    at = 1_796_152_509_123
    for shown in (console_time, breaker_time, watchdog_time, quarantine_time, cli_time, kcat_time):
        assert shown(at) == "2026-12-01T19:15:09.123Z", shown
    # What each shows for "not set" is its own, and a time beyond year 9999 is no crash.
    assert (cli_time(0), cli_time(None), console_time(0), breaker_time(0)) == ("-", "-", "—", None)
    assert cli_time(AVRO_LONG_MAX) == f"{AVRO_LONG_MAX} ms (beyond year 9999)"
    assert console_time(AVRO_LONG_MAX) == f"{AVRO_LONG_MAX} ms (beyond year 9999)"
    assert breaker_time(AVRO_LONG_MAX) is None
    row = flatten({"fields": {"expiresAt": AVRO_LONG_MAX, "issuedAt": at}}, AVRO_LONG_MAX)
    assert row["timestamp"] is None and row["expiresAtTime"] is None
    assert row["issuedAtTime"] == "2026-12-01T19:15:09.123Z"


def test_tail_lines_start_with_the_same_rfc3339_as_everywhere_else() -> None:
    from services.tenure_cli.topic_tools import _pretty

    line = _pretty(
        {
            "topic": "t",
            "partition": 0,
            "offset": 7,
            "type": "RunSubmitted",
            "key": "run_1",
            "fields": {"occurredAt": 1_796_152_509_123},
        }
    )
    assert line.startswith("2026-12-01T19:15:09.123Z  RunSubmitted")
    blank = _pretty(
        {
            "topic": "t",
            "partition": 0,
            "offset": 7,
            "type": "Undecodable",
            "key": None,
            "fields": {"occurredAt": AVRO_LONG_MAX},
        }
    )
    assert blank.startswith("-" * 24 + "  Undecodable")
