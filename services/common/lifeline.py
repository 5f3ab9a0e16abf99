"""Start a child process that cannot outlive its parent, even when the parent is SIGKILLed.

On Linux the child runs under a tiny exec wrapper (this file run as a script) that asks the
kernel for SIGKILL when its parent dies (prctl PR_SET_PDEATHSIG) and then execs the real
command, which keeps that setting. A wrapper rather than Popen's preexec_fn: preexec_fn runs
Python between fork and exec, which can deadlock when the parent has other threads (librdkafka
starts several), while the wrapper is a fresh single-threaded interpreter.

The kernel sends the signal when the *thread* that forked the child exits, so spawn from the
main thread of a process that lives as long as the child should. Elsewhere (macOS) there is no
such call: the command runs as is and only the parent's orderly shutdown stops it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Sequence

__all__ = ["PDEATHSIG_SUPPORTED", "lifeline_argv", "main"]

PDEATHSIG_SUPPORTED = sys.platform.startswith("linux")
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def lifeline_argv(command: Sequence[str]) -> list[str]:
    """`command`, wrapped so that the process it becomes is SIGKILLed when this process dies."""
    if not PDEATHSIG_SUPPORTED:
        return list(command)
    # -I -S: the wrapper needs neither site-packages nor PYTHON* variables; the command it execs
    # still gets the unchanged environment.
    return [sys.executable, "-I", "-S", os.path.abspath(__file__), str(os.getpid()), "--", *command]


def main(argv: Sequence[str]) -> int:
    parent, separator, *command = argv
    if separator != "--" or not command:
        print("usage: lifeline.py PARENT_PID -- COMMAND...", file=sys.stderr)
        return 2
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        print(f"lifeline: prctl(PR_SET_PDEATHSIG) failed: {os.strerror(errno)}", file=sys.stderr)
        return 1
    # The parent may have died between fork and prctl; then no signal would ever come.
    if os.getppid() != int(parent):
        return 1
    os.execvp(command[0], command)
    return 1  # not reached: execvp replaces this process or raises


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
