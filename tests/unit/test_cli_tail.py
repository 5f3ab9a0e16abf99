"""`tenure tail`'s default topics: trajectories and incidents included, and the help says so (issue 10)."""

from __future__ import annotations

from typing import Any

import pytest

from services.common.topics import (
    INCIDENTS,
    RUNS_EVENTS,
    RUNS_REJECTIONS,
    TOPICS,
    TRAJECTORIES_EVENTS,
    TRAJECTORIES_REJECTIONS,
)
from services.tenure_cli import main as cli
from services.tenure_cli import topic_tools

pytestmark = pytest.mark.timeout(30)


def _help(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    with pytest.raises(SystemExit) as exited:
        cli.main([*args, "--help"])
    assert exited.value.code == 0
    # argparse wraps lines; compare word by word.
    return " ".join(capsys.readouterr().out.split())


def test_the_default_covers_runs_trajectories_and_incidents() -> None:
    wanted = (RUNS_EVENTS, RUNS_REJECTIONS, TRAJECTORIES_EVENTS, TRAJECTORIES_REJECTIONS, INCIDENTS)
    assert {spec.name for spec in wanted} <= set(topic_tools.DEFAULT_TAIL_TOPICS)
    assert set(topic_tools.DEFAULT_TAIL_TOPICS) <= {spec.name for spec in TOPICS}  # no typo


def test_tail_help_names_exactly_the_default_topics(capsys: pytest.CaptureFixture[str]) -> None:
    text = _help(capsys, "tail")
    assert f"default: {' '.join(topic_tools.DEFAULT_TAIL_TOPICS)})" in text
    assert "run events + rejections" not in text  # the old, wrong wording


def test_replay_help_names_its_default_topic(capsys: pytest.CaptureFixture[str]) -> None:
    assert f"(default {topic_tools.DEFAULT_REPLAY_TOPIC})" in _help(capsys, "replay")


class _RecordingFollower:
    """Stands in for the Kafka follower: records what `tail` asked for, delivers nothing."""

    asked: list[list[str]] = []

    def __init__(self, bootstrap: str, topics: list[str], start_at: Any, client_id: str) -> None:
        _RecordingFollower.asked.append(list(topics))

    def poll(self, max_records: int = 500, timeout_s: float = 0.2) -> list[Any]:
        return []

    def close(self) -> None:
        pass


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["tail", "--idle-exit", "0"], list(topic_tools.DEFAULT_TAIL_TOPICS)),
        (["tail", "runs.events", "--idle-exit", "0"], ["runs.events"]),
    ],
)
def test_tail_follows_the_default_topics_unless_told_otherwise(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], expected: list[str]
) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9")
    monkeypatch.setattr(topic_tools, "TopicFollower", _RecordingFollower)
    _RecordingFollower.asked = []
    assert cli.main(argv) == 0
    assert _RecordingFollower.asked == [expected]
