"""DUR-3, the short scoreboard: 50 trajectories with the seed's fault profile (20% of turns:
network drops, tool exceptions, host process kills of the runner and of Tenure's own processes,
format corruption) through the whole of Tenure on a real broker, audited by the environment.

The bar of the full benchmark (`make bench-faults`, 1,000 trajectories) holds here too: no
corruption, no duplicated effect, no orphaned resource, no committed turn lost (RPO = 0).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.faults.harness import run_scoreboard

pytestmark = [pytest.mark.integration, pytest.mark.serial, pytest.mark.timeout(600)]


@pytest.fixture
def shared_broker(kafka_bootstrap: str) -> Iterator[str]:
    """The harness uses KAFKA_BOOTSTRAP_SERVERS when it is set: the session's broker."""
    previous = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    os.environ["KAFKA_BOOTSTRAP_SERVERS"] = kafka_bootstrap
    try:
        yield kafka_bootstrap
    finally:
        if previous is None:
            os.environ.pop("KAFKA_BOOTSTRAP_SERVERS", None)
        else:
            os.environ["KAFKA_BOOTSTRAP_SERVERS"] = previous


def test_fifty_faulty_trajectories_through_tenure_leave_no_corruption_dur_3(
    shared_broker: str, tmp_path: Path
) -> None:
    board = run_scoreboard(["tenure"], 50, seed=7, workers=4, progress=False, workdir=tmp_path)
    result = board.result("tenure")
    faults = board.faults
    assert faults["turns"] - faults["none"] > 0.1 * faults["turns"]  # the profile really injected faults
    assert result.runner_kills + result.tenure_kills > 0  # and real SIGKILLs happened
    assert result.counts.get("corrupted", 0) == 0, result.reasons
    assert result.duplicates == 0 and result.semantic_duplicates == 0
    assert result.orphans == 0
    assert result.rpo_turns == 0
    assert result.timeouts == 0 and result.runner_errors == 0
    # Every trajectory ends completed, cleanly aborted or escalated with a correct incident.
    assert sum(result.counts.values()) == 50
    assert result.completion_rate >= 0.9, result.counts
