"""A child started under a lifeline dies with its parent, even when the parent is SIGKILLed (issue 10)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from services.common.lifeline import PDEATHSIG_SUPPORTED, lifeline_argv
from tests.support.processes import adopting_orphans, alive
from tests.support.system import wait_until

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not PDEATHSIG_SUPPORTED, reason="PR_SET_PDEATHSIG is Linux only"),
]

REPO_ROOT = Path(__file__).resolve().parents[2]
# A parent that starts one child under a lifeline and one without, says their pids, and waits.
PARENT = """
import subprocess, sys, time
from services.common.lifeline import lifeline_argv
guarded = subprocess.Popen(lifeline_argv(["sleep", "60"]), start_new_session=True)
plain = subprocess.Popen(["sleep", "60"], start_new_session=True)
print(guarded.pid, plain.pid, flush=True)
time.sleep(60)
"""


def _cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


def test_a_guarded_child_is_killed_with_its_sigkilled_parent_and_a_plain_one_is_orphaned() -> None:
    with adopting_orphans():
        parent = subprocess.Popen(
            [sys.executable, "-c", PARENT],
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            stdout=subprocess.PIPE,
            text=True,
        )
        assert parent.stdout is not None
        guarded, plain = map(int, parent.stdout.readline().split())
        try:
            # The wrapper has set the parent-death signal and exec'd: same pid, the real command.
            wait_until(lambda: _cmdline(guarded) == ["sleep", "60"], 10, "the wrapper to exec")
            parent.send_signal(signal.SIGKILL)
            parent.wait(10)
            wait_until(lambda: not alive(guarded), 5, "the guarded child to die with its parent")
            assert alive(plain)  # the control: without the lifeline the child is orphaned
        finally:
            if alive(plain):
                os.kill(plain, signal.SIGKILL)
            for pid in (guarded, plain):
                wait_until(lambda pid=pid: not alive(pid), 5, f"pid {pid} reaped")


def test_the_wrapper_passes_the_command_through_unchanged() -> None:
    argv = lifeline_argv(["echo", "a b", "--flag"])
    assert argv[-4:] == ["--", "echo", "a b", "--flag"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=True)
    assert result.stdout == "a b --flag\n"
