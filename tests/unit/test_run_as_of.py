"""A run as it was at a time or a version (issue 17, "Point in time"): `asOf` parsing and the
fold of a prefix of the run's events with the Run's own fold."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.command_api.as_of import AsOf, BadAsOf, fold_as_of, parse_as_of
from services.projections.views import fold_run, render_run
from tests.support.lease_run import Run, renew_cmd

pytestmark = pytest.mark.timeout(30)


def _story() -> Run:
    run = Run()
    claimed = run.claim()
    for sequence in (1, 2, 3):
        run.at(run.now + 1_000)
        run.accept(renew_cmd(run.run_id, claimed.attempt_id, claimed.epoch, sequence))
    return run


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-12-01T10:00:00Z", AsOf(time_ms=1_796_119_200_000)),
        ("2026-12-01T11:00:00+01:00", AsOf(time_ms=1_796_119_200_000)),
        ("2026-12-01T10:00:00.250Z", AsOf(time_ms=1_796_119_200_250)),
        ("1796119200000", AsOf(time_ms=1_796_119_200_000)),
        ("v3", AsOf(version=3)),
    ],
)
def test_as_of_accepts_rfc3339_epoch_ms_and_versions(text: str, expected: AsOf) -> None:
    assert parse_as_of(text) == expected


@pytest.mark.parametrize(
    "text",
    ["", "yesterday", "2026-12-01T10:00:00", "v0", "v-1", "1" * 16, "2026-13-01T00:00:00Z", "<script>"],
)
def test_anything_else_is_refused_with_what_would_do(text: str) -> None:
    with pytest.raises(BadAsOf, match=r"RFC 3339|version"):
        parse_as_of(text)


def test_the_view_at_a_version_is_the_fold_of_that_many_events() -> None:
    run = _story()
    events = run.events
    for version in range(1, len(events) + 1):
        view = fold_as_of(events, AsOf(version=version))
        expected = fold_run(events[:version])
        assert expected is not None and view is not None
        assert {k: v for k, v in view.items() if k != "asOf"} == render_run(expected)
        assert view["asOf"] == {"version": version, "occurredAt": events[version - 1].occurred_at}


def test_the_view_at_a_time_includes_exactly_the_events_that_had_happened() -> None:
    run = _story()
    events = run.events
    before_first = fold_as_of(events, AsOf(time_ms=events[0].occurred_at - 1))
    assert before_first is None  # the run did not exist yet
    for event in events:
        view = fold_as_of(events, AsOf(time_ms=event.occurred_at))
        assert view is not None and view["version"] == max(
            e.version for e in events if e.occurred_at <= event.occurred_at
        )


@given(cut=st.integers(min_value=1, max_value=5))
def test_a_later_as_of_never_shows_less(cut: int) -> None:
    events = _story().events
    earlier = fold_as_of(events, AsOf(version=cut))
    later = fold_as_of(events, AsOf(version=cut + 1))
    assert earlier is not None and later is not None
    assert later["history"][: len(earlier["history"])] == earlier["history"]
