"""WD-6: the seed's worked figure, reproduced with its token model and the detector itself.

The model (the seed's "what an unnoticed loop costs"): the first looping turn sends s0 = 1,000
tokens; each turn outputs 300 tokens and provokes an 800-token error, so the re-sent context
grows by delta = 1,100 per turn; n turns send n * s0 + delta * n (n - 1) / 2 input tokens.
Illustrative prices $3 / M input and $15 / M output tokens, 10 s per turn, no prefix caching.
"""

from __future__ import annotations

import pytest

from services.watchdog.domain import SEED_LOOP
from tests.unit.watchdog.support import Watchdog
from tests.unit.watchdog.test_corpus import TRAJECTORIES, observations

CEILING = 50  # the run's turn budget: the only stop without a progress signal


def test_the_model_is_the_seeds_arithmetic_series() -> None:
    assert SEED_LOOP.growth == 1_100
    for turns in range(1, 60):
        per_turn = sum(SEED_LOOP.first_turn_tokens + SEED_LOOP.growth * i for i in range(turns))
        assert SEED_LOOP.input_tokens(turns) == per_turn


def test_a_two_state_loop_stopped_by_the_ceiling_costs_1_397_500_tokens_wd_6() -> None:
    ceiling = SEED_LOOP.cost(CEILING)
    assert ceiling.input_tokens == 1_397_500
    assert round(ceiling.dollars, 2) == 4.42
    assert ceiling.seconds == 500  # "about 8 minutes"
    assert round(ceiling.seconds / 60) == 8


def test_the_detector_stops_the_seeds_loop_at_turn_4_for_10_600_tokens_about_89x_cheaper_wd_6() -> None:
    """The seed's 2-state loop (read the config, edit line 42, revert, edit again) is caught by
    the cycle detector at turn 4; that turn count priced with the same model is the figure."""
    watchdog = Watchdog().run(observations(TRAJECTORIES["period-2-orbit"]))
    first = watchdog.detections()[0]
    stopped, ceiling = SEED_LOOP.cost(first.turn), SEED_LOOP.cost(CEILING)
    print(
        f"\nWD-6: loop caught at turn {first.turn}: {stopped.input_tokens} input tokens, "
        f"${stopped.dollars:.2f}, {stopped.seconds:.0f} s; ceiling: {ceiling.input_tokens} tokens"
    )
    assert first.turn == 4 and first.period == 2
    assert stopped.input_tokens == 10_600
    assert round(stopped.dollars, 2) == 0.05 and stopped.seconds == 40
    ratio = SEED_LOOP.cost(CEILING).dollars / stopped.dollars
    assert ratio == pytest.approx(89, abs=0.5)  # "about 89x cheaper" (in money; 132x in tokens)
    assert SEED_LOOP.cost(CEILING).input_tokens / stopped.input_tokens == pytest.approx(131.8, abs=0.1)
