"""`tenure up --runner-host RUN_ID --agent-command ...`: the managed runner host in the fleet."""

from __future__ import annotations

import time

import pytest

from services.common.settings import child_environment
from services.tenure_cli import supervisor
from services.tenure_cli.main import build_parser
from services.tenure_cli.readiness import ReadinessCheck

pytestmark = pytest.mark.timeout(60)


def test_up_takes_a_runner_host_only_when_asked() -> None:
    plain = build_parser().parse_args(["up"])
    assert plain.runner_host is None and plain.agent_command is None
    asked = build_parser().parse_args(
        ["up", "--runner-host", "run_x", "--agent-command", "python agent.py -v"]
    )
    assert (asked.runner_host, asked.agent_command, asked.runner_host_claim_wait) == (
        "run_x",
        "python agent.py -v",
        3600.0,
    )


def test_up_refuses_a_runner_host_without_an_agent_command() -> None:
    args = build_parser().parse_args(["up", "--runner-host", "run_x"])
    with pytest.raises(ValueError, match="--agent-command"):
        supervisor.up(args)


def test_the_runner_host_child_runs_once_and_is_not_restarted(capsys: pytest.CaptureFixture[str]) -> None:
    """A managed runner runs one run: its exit is said once and never restarted (or counted as a
    crash that stops the fleet); while the fleet stops, its real exit code is seen."""
    fleet = supervisor._Supervisor()
    host = supervisor._RunnerHost(fleet, ["--help"], ReadinessCheck(), child_environment())
    fleet.launch(host)
    assert host.process is not None
    host.process.wait(30)
    for _ in range(3):
        fleet.tick()
        time.sleep(0.01)
    assert host.restart_at is None and host.exits == [] and not fleet.stopping
    assert capsys.readouterr().out.count("runner-host exited with 0") == 1
    fleet.stopping = True
    assert host.exit_code() == 0
