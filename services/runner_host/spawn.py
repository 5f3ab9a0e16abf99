"""The exec wrapper that puts a managed child into its containment before it runs a single
instruction of its own (run as a script: `python -I -S spawn.py ... -- COMMAND...`).

In order: enrol this process in each cgroup (write its pid to the cgroup.procs files), join
the network namespace (setns on /run/netns/<name>), ask for SIGKILL when the host dies
(PR_SET_PDEATHSIG, as services/common/lifeline.py does), then exec the command, which inherits
all three. A wrapper rather than Popen's preexec_fn: the host has threads (the lease keeper,
the quarantine watch), and running Python between fork and exec in a threaded parent can
deadlock. Stdlib only, single-threaded, and it fails loudly (exit 125) rather than run the
command uncontained.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["SPAWN_FAILED", "main", "spawn_argv"]

SPAWN_FAILED = 125
_PR_SET_PDEATHSIG = 1
_CLONE_NEWNET = 0x40000000


def spawn_argv(
    command: Sequence[str],
    *,
    procs_files: Sequence[Path] = (),
    netns: Path | None = None,
    parent_pid: int | None = None,
) -> list[str]:
    """The argv that runs `command` inside the given cgroups and namespace, dying with `parent_pid`."""
    argv = [sys.executable, "-I", "-S", os.path.abspath(__file__)]
    for path in procs_files:
        argv += ["--procs", str(path)]
    if netns is not None:
        argv += ["--netns", str(netns)]
    if parent_pid is not None:
        argv += ["--parent", str(parent_pid)]
    return [*argv, "--", *command]


def _fail(why: str) -> int:
    print(f"runner-host spawn: {why}; not running the command uncontained", file=sys.stderr)
    return SPAWN_FAILED


def main(argv: Sequence[str]) -> int:
    procs: list[str] = []
    netns: str | None = None
    parent: int | None = None
    rest = list(argv)
    while rest and rest[0] != "--":
        flag, value, *rest = rest
        if flag == "--procs":
            procs.append(value)
        elif flag == "--netns":
            netns = value
        elif flag == "--parent":
            parent = int(value)
        else:
            return _fail(f"unknown flag {flag}")
    command = rest[1:]
    if not command:
        return _fail("no command")
    libc = ctypes.CDLL(None, use_errno=True)
    for path in procs:
        try:
            with open(path, "w") as handle:
                handle.write(str(os.getpid()))
        except OSError as exc:
            return _fail(f"cannot join cgroup {path}: {exc}")
    if netns is not None:
        try:
            fd = os.open(netns, os.O_RDONLY)
        except OSError as exc:
            return _fail(f"cannot open network namespace {netns}: {exc}")
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            return _fail(f"setns({netns}): {os.strerror(ctypes.get_errno())}")
        os.close(fd)
    if parent is not None:
        if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            return _fail(f"prctl(PR_SET_PDEATHSIG): {os.strerror(ctypes.get_errno())}")
        if os.getppid() != parent:  # the host died between fork and prctl
            return SPAWN_FAILED
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        return _fail(f"cannot exec {command[0]}: {exc}")
    return SPAWN_FAILED  # not reached: execvp does not return


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
