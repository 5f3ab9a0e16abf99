"""The lease bench's line on the garbage collector in a window (bench/_leases_system.gc_summary):
passes per generation are the window's (after - before); the longest pass, kept by the service
since it began, is said only when it grew in the window."""

from __future__ import annotations

from bench._leases_system import gc_summary


def _figures(young: int, young_s: float, longest_young_s: float, over_100ms: int = 0) -> dict[str, float]:
    return {
        "g0_count": young,
        "g0_sum": young_s,
        "g0_longest": longest_young_s,
        "g1_count": 2,
        "g1_sum": 0.3,
        "g1_longest": 0.2,
        "g2_count": 0,
        "g2_sum": 0.0,
        "over_100ms": over_100ms,
    }


def test_a_window_counts_its_own_passes_and_names_a_longest_pass_that_is_new() -> None:
    before = {"lease_coordinator": _figures(100, 0.5, 0.04)}
    after = {"lease_coordinator": _figures(160, 0.9, 0.12, over_100ms=1)}
    line = gc_summary(before, after)
    assert line == (
        "lease_coordinator: 0 full passes (0 ms), 0 middle (0 ms), 60 young (400 ms), 1 over 100 ms, "
        "the longest 120 ms"
    )


def test_a_longest_pass_from_before_the_window_is_not_reported_and_a_silent_service_says_so() -> None:
    before = {"command_api": _figures(10, 0.1, 0.3), "lease_coordinator": _figures(1, 0.0, 0.0)}
    after = {"command_api": _figures(12, 0.12, 0.3), "lease_coordinator": {}}
    line = gc_summary(before, after)
    assert line == (
        "command_api: 0 full passes (0 ms), 0 middle (0 ms), 2 young (20 ms), 0 over 100 ms; "
        "lease_coordinator: not scraped"
    )
