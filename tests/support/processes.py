"""Checking on real processes: is a pid still there, and adopting the orphans of a killed parent."""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterator
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>


def alive(pid: int) -> bool:
    """Whether `pid` still exists; an orphan adopted by this process is reaped first."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def children_of(parent: int) -> set[int]:
    """The pids whose parent is `parent`, from /proc."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == parent:
                found.add(int(entry.name))
    return found


@contextlib.contextmanager
def adopting_orphans() -> Iterator[None]:
    """Make this process the child subreaper (Linux): the children of a SIGKILLed parent are
    re-parented here instead of to init, so `alive` can reap them and then check strictly with
    kill(pid, 0) that no pid of them remains (init may take its time to reap)."""
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    try:
        yield
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
