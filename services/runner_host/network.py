"""Give a managed child a network of its own, and take it away in one step (QUA-1 stage 3).

`NetnsNetwork`: the child runs in a network namespace `<prefix><suffix>` joined to the host by a
veth pair (a /30 of its own: the host end is `host_address`, the child's `child_address`, and
the child's default route goes through the host end). Severing is `ip link set <host end> down`:
the child's end loses its carrier and nothing it sends reaches the host or anything beyond it.
Only the adapter runs `ip`; the namespace is deleted with its veth when the child is gone.

`NoNetwork`: where namespaces are not available (no root, no `ip`), the child shares the host's
network and severing is reported as "unavailable", never pretended.

A SIGKILLed host leaves its namespaces behind; the next start with the same host id deletes
every namespace named with its prefix (`remove_stale_networks`), and with it the veth pairs.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import logging
import os
import shutil
import socket
import struct
import subprocess
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

__all__ = [
    "NETNS_LINK_DOWN",
    "UNAVAILABLE",
    "NetnsNetwork",
    "Network",
    "NetworkError",
    "NetworkFactory",
    "NoNetwork",
    "probe_network",
    "remove_stale_networks",
    "veth_prefix",
]

log = logging.getLogger("tenure.runner_host")

NETNS_LINK_DOWN = "netns-link-down"
UNAVAILABLE = "unavailable"
NETNS_DIR = Path("/run/netns")
_IP_TIMEOUT_S = 5.0


class NetworkError(RuntimeError):
    """An `ip` command failed."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=_IP_TIMEOUT_S)
    if check and done.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done


_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_IFREQ = "16sH22x"  # struct ifreq: the name, then ifr_flags (the union is 24 bytes)


def _set_link_down(name: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack(_IFREQ, name.encode(), 0)
        flags = struct.unpack(_IFREQ, fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack(_IFREQ, name.encode(), flags & ~_IFF_UP))


def veth_prefix(prefix: str) -> str:
    """A short tag for the veth names of one host id (interface names have 15 bytes at most)."""
    return "tv" + hashlib.sha256(prefix.encode()).hexdigest()[:6]


class Network(ABC):
    """One child's network. `prepare` before the child starts, `close` once it is gone."""

    mechanism: ClassVar[str]  # what `sever` does, as the stage report names it
    host_address: str | None = None
    child_address: str | None = None

    def __init__(self) -> None:
        self.severed = False

    def prepare(self) -> None: ...  # noqa: B027 - an optional hook

    def netns_path(self) -> Path | None:
        """The namespace the child joins before it execs (spawn.py), if any."""
        return None

    @abstractmethod
    def sever(self) -> None: ...

    def close(self) -> None: ...  # noqa: B027 - an optional hook


NetworkFactory = Callable[[str], Network]  # namespace name -> a fresh network for one child


class NoNetwork(Network):
    mechanism = UNAVAILABLE

    def sever(self) -> None:
        # Nothing can be taken down: the child shares the host's network. Reported, not hidden.
        self.severed = False


class NetnsNetwork(Network):
    mechanism = NETNS_LINK_DOWN

    def __init__(self, name: str, prefix: str, subnet: str = "10.213.0.0/16") -> None:
        super().__init__()
        self.name = name
        tag = veth_prefix(prefix)
        suffix = hashlib.sha256(name.encode()).hexdigest()[:4]
        self.host_veth = f"{tag}{suffix}h"
        self.child_veth = f"{tag}{suffix}c"
        self._subnet = ipaddress.ip_network(subnet)
        self._slot_seed = int(hashlib.sha256(name.encode()).hexdigest()[:8], 16)

    def _pick_slot(self) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
        slots = list(self._subnet.subnets(new_prefix=30)) if self._subnet.version == 4 else []
        if not slots:
            raise NetworkError(f"subnet {self._subnet} has no /30 to give")
        used = _ip("-o", "addr", "show").stdout
        for step in range(len(slots)):
            slot = slots[(self._slot_seed + step) % len(slots)]
            hosts = list(slot.hosts())
            if f" {hosts[0]}/" not in used and f" {hosts[1]}/" not in used:
                return slot
        raise NetworkError(f"every /30 of {self._subnet} is in use")

    def prepare(self) -> None:
        slot = self._pick_slot()
        host, child = (str(a) for a in list(slot.hosts())[:2])
        _ip("netns", "add", self.name)
        try:
            _ip("link", "add", self.host_veth, "type", "veth", "peer", "name", self.child_veth)
            _ip("link", "set", self.child_veth, "netns", self.name)
            _ip("addr", "add", f"{host}/30", "dev", self.host_veth)
            _ip("link", "set", self.host_veth, "up")
            _ip("-n", self.name, "addr", "add", f"{child}/30", "dev", self.child_veth)
            _ip("-n", self.name, "link", "set", self.child_veth, "up")
            _ip("-n", self.name, "link", "set", "lo", "up")
            _ip("-n", self.name, "route", "add", "default", "via", host)
        except Exception:
            self.close()
            raise
        self.host_address, self.child_address = host, child

    def netns_path(self) -> Path:
        return NETNS_DIR / self.name

    def sever(self) -> None:
        # What `ip link set <veth> down` does, as one ioctl: no process to spawn on the hot path
        # (a fork+exec of `ip` costs milliseconds); `ip` itself only if the ioctl is refused.
        try:
            _set_link_down(self.host_veth)
        except OSError as exc:
            log.warning("SIOCSIFFLAGS on %s failed (%s); using ip link", self.host_veth, exc)
            _ip("link", "set", self.host_veth, "down")
        self.severed = True

    def close(self) -> None:
        # Deleting the namespace destroys the child's end, and a veth dies with its peer; the
        # explicit delete covers a pair whose child end never moved into the namespace.
        _ip("netns", "delete", self.name, check=False)
        _ip("link", "delete", self.host_veth, check=False)


def probe_network(prefer: str = "auto") -> tuple[str, Callable[[str, str], Network]]:
    """netns-link-down where `ip netns` works here (root, iproute2), else unavailable.

    The factory takes (namespace name, host prefix). `prefer` = "auto", "netns" or "none"."""
    if prefer not in ("auto", "netns", "none"):
        raise ValueError(f"unknown network {prefer!r}; one of auto, netns, none")
    if prefer != "none" and shutil.which("ip") is not None:
        probe = f"tenure-probe-{os.getpid()}"
        try:
            _ip("netns", "add", probe)
        except (NetworkError, OSError, subprocess.TimeoutExpired) as exc:
            log.warning("network namespaces unavailable (%s); the child shares the host's network", exc)
        else:
            _ip("netns", "delete", probe, check=False)
            return NETNS_LINK_DOWN, lambda name, prefix: NetnsNetwork(name, prefix)
    return UNAVAILABLE, lambda _name, _prefix: NoNetwork()


def remove_stale_networks(prefix: str) -> list[str]:
    """Delete every namespace `<prefix>...` and every veth of this prefix left by a dead host."""
    removed: list[str] = []
    if shutil.which("ip") is None:
        return removed
    with contextlib.suppress(NetworkError, OSError, subprocess.TimeoutExpired):
        for line in _ip("netns", "list").stdout.splitlines():
            name = line.split()[0] if line.split() else ""
            if name.startswith(prefix):
                _ip("netns", "delete", name, check=False)
                removed.append(name)
        tag = veth_prefix(prefix)
        for line in _ip("-o", "link", "show").stdout.splitlines():
            parts = line.split(":")
            if len(parts) < 2:
                continue
            name = parts[1].strip().split("@")[0]
            if name.startswith(tag):
                _ip("link", "delete", name, check=False)
                removed.append(name)
    return removed
