"""Suspend a managed child's whole process tree (QUA-1 stage 1), by the best mechanism there is.

Three adapters behind one interface, chosen by probing (`probe_freezers`, best first):

  cgroup-v2-freeze   a cgroup of its own in a unified hierarchy (`cgroup.freeze`, confirmed by
                     `frozen 1` in `cgroup.events`); also kills the tree at once (`cgroup.kill`)
  cgroup-v1-freezer  a cgroup of its own in the v1 `freezer` hierarchy (`freezer.state`,
                     confirmed when it reads FROZEN)
  sigstop            SIGSTOP to the child's process group, confirmed when every member is
                     stopped; a member that left the group (setsid) escapes it, which is why it
                     is the last resort and is reported as such

A cgroup holds every descendant, whatever process group or session it moves to. The child
enrols itself in the cgroup before it execs (spawn.py), so nothing it starts is ever outside.
Cgroups are named `<prefix><suffix>` with the host's prefix, so that a host that was SIGKILLed
leaves nothing behind for long: the next start with that host id removes them
(`remove_stale_cgroups`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import ClassVar

from services.common.backoff import Backoff

__all__ = [
    "CGROUP_V1_FREEZER",
    "CGROUP_V2_FREEZE",
    "SIGSTOP",
    "CgroupV1Freezer",
    "CgroupV2Freezer",
    "FreezeTimeout",
    "Freezer",
    "FreezerFactory",
    "SigstopFreezer",
    "group_members",
    "probe_freezers",
    "remove_stale_cgroups",
    "v1_freezer_root",
    "v2_root",
]

log = logging.getLogger("tenure.runner_host")

CGROUP_V2_FREEZE = "cgroup-v2-freeze"
CGROUP_V1_FREEZER = "cgroup-v1-freezer"
SIGSTOP = "sigstop"
_POLL_S = 0.0002  # confirmation polls: the kernel freezes in well under a millisecond here


class FreezeTimeout(RuntimeError):
    """The tree was asked to freeze but was not confirmed frozen in time."""


class Freezer(ABC):
    """One child's suspension mechanism. `attach` once the child exists, `close` once it is gone."""

    mechanism: ClassVar[str]

    def __init__(self) -> None:
        self.pgid: int | None = None
        self.frozen = False

    def prepare(self) -> None:  # noqa: B027 - an optional hook
        """Create what the child must join before it runs (nothing for SIGSTOP)."""

    def procs_files(self) -> tuple[Path, ...]:
        """The cgroup.procs files the child writes its own pid to before exec (spawn.py)."""
        return ()

    def attach(self, pgid: int) -> None:
        self.pgid = pgid

    @abstractmethod
    def freeze(self, timeout_s: float = 2.0) -> None:
        """Return once the whole tree is confirmed suspended; FreezeTimeout otherwise."""

    @abstractmethod
    def thaw(self) -> None: ...

    @abstractmethod
    def members(self) -> set[int]:
        """Every live process of the tree this mechanism can see."""

    def kill(self) -> None:
        """SIGKILL the whole tree, then thaw it: a frozen task dies only once thawed (v1), and a
        SIGKILL queued before the thaw means it never runs another instruction of its own."""
        self._signal_members(signal.SIGKILL)
        if self.frozen:
            self.thaw()

    def signal(self, signum: int) -> None:
        """Send `signum` to the child's process group and every member of its cgroup."""
        self._signal_members(signum)

    def close(self) -> None:  # noqa: B027 - an optional hook
        """Remove what `prepare` created (the tree must be gone)."""

    def _signal_members(self, signum: int) -> None:
        if self.pgid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pgid, signum)
        for pid in self.members():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)


FreezerFactory = Callable[[str], Freezer]  # cgroup name -> a fresh freezer for one child


def _write(path: Path, text: str) -> None:
    with open(path, "w") as handle:  # one write(2): cgroup files take one value per write
        handle.write(text)


def _read_pids(path: Path) -> set[int]:
    try:
        return {int(line) for line in path.read_text().split()}
    except (FileNotFoundError, ProcessLookupError, ValueError):
        return set()


def _wait(done: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise FreezeTimeout(f"{what} not confirmed within {timeout_s:g}s")
        time.sleep(_POLL_S)


def _remove_cgroup(path: Path, kill: Callable[[], None], timeout_s: float = 2.0) -> None:
    """rmdir a cgroup, killing what is still in it first (a cgroup with tasks cannot go)."""
    if not path.exists():
        return
    deadline = time.monotonic() + timeout_s
    backoff = Backoff(base_s=0.002, cap_s=0.1)  # BRK-3: the one full-jitter backoff
    while True:
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                log.error("cgroup %s is still busy after %gs; left behind", path, timeout_s)
                return
            kill()
        time.sleep(backoff.next_delay())


class CgroupV2Freezer(Freezer):
    mechanism = CGROUP_V2_FREEZE

    def __init__(self, root: Path, name: str) -> None:
        super().__init__()
        self.path = root / name

    def prepare(self) -> None:
        self.path.mkdir(exist_ok=False)

    def procs_files(self) -> tuple[Path, ...]:
        return (self.path / "cgroup.procs",)

    def freeze(self, timeout_s: float = 2.0) -> None:
        _write(self.path / "cgroup.freeze", "1")
        self.frozen = True
        _wait(lambda: "frozen 1" in (self.path / "cgroup.events").read_text(), timeout_s, "cgroup v2 freeze")

    def thaw(self) -> None:
        _write(self.path / "cgroup.freeze", "0")
        self.frozen = False

    def members(self) -> set[int]:
        return _read_pids(self.path / "cgroup.procs")

    def kill(self) -> None:
        # cgroup.kill reaches every task at once, frozen ones included (no thaw needed).
        kill_file = self.path / "cgroup.kill"
        if kill_file.exists():
            with contextlib.suppress(FileNotFoundError):
                _write(kill_file, "1")
        super().kill()

    def close(self) -> None:
        _remove_cgroup(self.path, self.kill)


class CgroupV1Freezer(Freezer):
    mechanism = CGROUP_V1_FREEZER

    def __init__(self, root: Path, name: str) -> None:
        super().__init__()
        self.path = root / name

    def prepare(self) -> None:
        self.path.mkdir(exist_ok=False)

    def procs_files(self) -> tuple[Path, ...]:
        return (self.path / "cgroup.procs",)

    def _state(self) -> str:
        return (self.path / "freezer.state").read_text().strip()

    def freeze(self, timeout_s: float = 2.0) -> None:
        _write(self.path / "freezer.state", "FROZEN")
        self.frozen = True
        # FREEZING until every task is frozen; re-writing FROZEN retries the stragglers.
        _wait(lambda: self._state() == "FROZEN", timeout_s, "cgroup v1 freezer")

    def thaw(self) -> None:
        _write(self.path / "freezer.state", "THAWED")
        self.frozen = False

    def members(self) -> set[int]:
        return _read_pids(self.path / "cgroup.procs")

    def close(self) -> None:
        _remove_cgroup(self.path, self.kill)


def group_members(pgid: int) -> set[int]:
    """The live processes whose process group is `pgid` (from /proc)."""
    found: set[int] = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        stat = _stat(int(entry.name))
        if stat is not None and stat[1] == pgid and stat[0] != "Z":
            found.add(int(entry.name))
    return found


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, pgid) of `pid` from /proc/<pid>/stat; None once it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = raw[raw.rindex(")") + 2 :].split()  # the command name may contain spaces
    return fields[0], int(fields[2])


class SigstopFreezer(Freezer):
    """The fallback: SIGSTOP the process group and confirm every member reads stopped (T)."""

    mechanism = SIGSTOP

    def freeze(self, timeout_s: float = 2.0) -> None:
        if self.pgid is None:
            raise FreezeTimeout("no process group to stop")
        os.killpg(self.pgid, signal.SIGSTOP)
        self.frozen = True
        members = group_members(self.pgid)

        def stopped() -> bool:
            states = [_stat(pid) for pid in members]
            return all(s is None or s[0] in ("T", "t", "Z", "X") for s in states)

        _wait(stopped, timeout_s, "SIGSTOP of the process group")

    def thaw(self) -> None:
        if self.pgid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pgid, signal.SIGCONT)
        self.frozen = False

    def members(self) -> set[int]:
        return set() if self.pgid is None else group_members(self.pgid)


def v2_root(
    candidates: Sequence[Path] = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")),
) -> Path | None:
    """A writable unified (v2) hierarchy whose child cgroups have cgroup.freeze, if any."""
    for root in candidates:
        if not (root / "cgroup.procs").exists() or not (root / "cgroup.controllers").exists():
            continue
        probe = root / f"tenure-probe-{os.getpid()}"
        try:
            probe.mkdir()
        except OSError:
            continue
        try:
            if (probe / "cgroup.freeze").exists():
                return root
        finally:
            with contextlib.suppress(OSError):
                probe.rmdir()
    return None


def v1_freezer_root(root: Path = Path("/sys/fs/cgroup/freezer")) -> Path | None:
    """The v1 freezer hierarchy, if it is mounted and we may create cgroups in it."""
    if not (root / "freezer.state").exists() and not (root / "cgroup.procs").exists():
        return None
    return root if os.access(root, os.W_OK) else None


def probe_freezers(prefer: str = "auto") -> tuple[str, FreezerFactory]:
    """The best mechanism available (or `prefer`, if it is one of them) and its factory.

    `prefer` = "auto" or a mechanism name; a named mechanism that is unavailable falls back to
    the next one down the list, and the choice made is what the host reports."""
    order = [CGROUP_V2_FREEZE, CGROUP_V1_FREEZER, SIGSTOP]
    if prefer != "auto":
        if prefer not in order:
            raise ValueError(f"unknown freezer {prefer!r}; one of auto, {', '.join(order)}")
        order = order[order.index(prefer) :]
    for mechanism in order:
        if mechanism == CGROUP_V2_FREEZE and (v2 := v2_root()) is not None:
            return mechanism, lambda name, root=v2: CgroupV2Freezer(root, name)
        if mechanism == CGROUP_V1_FREEZER and (v1 := v1_freezer_root()) is not None:
            return mechanism, lambda name, root=v1: CgroupV1Freezer(root, name)
    return SIGSTOP, lambda _name: SigstopFreezer()


def remove_stale_cgroups(prefix: str) -> list[Path]:
    """Remove every cgroup named `<prefix>...` in either hierarchy (a SIGKILLed host's leftovers):
    its tasks are killed (and thawed, so they can die) first. Returns what was removed."""
    removed: list[Path] = []
    roots = [r for r in (v2_root(), v1_freezer_root()) if r is not None]
    for root in roots:
        for path in sorted(root.glob(f"{prefix}*")):
            if not path.is_dir():
                continue
            freezer: Freezer = (
                CgroupV2Freezer(root, path.name)
                if (path / "cgroup.freeze").exists()
                else CgroupV1Freezer(root, path.name)
            )
            freezer.frozen = True  # whatever its state, thaw after the kill
            freezer.close()
            if not path.exists():
                removed.append(path)
    return removed
