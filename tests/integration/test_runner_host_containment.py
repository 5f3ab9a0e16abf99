"""The managed runner host's containment mechanisms on real children, without the API (QUA-1).

Each child appends to a file and sends UDP datagrams to the host end of its veth, where the test
listens: after freezing, the file stops growing; after severing, no datagram arrives; kill works
on a frozen tree; the SIGSTOP fallback is forced and reported; nothing is left behind, also
after the host process itself is SIGKILLed (the next start with its host id cleans up).
"""

from __future__ import annotations

import http.server
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.runner_host import freezer as freezer_module
from services.runner_host.child import Containment, ManagedChild
from services.runner_host.freezer import (
    CGROUP_V1_FREEZER,
    CGROUP_V2_FREEZE,
    SIGSTOP,
    probe_freezers,
    v1_freezer_root,
    v2_root,
)
from services.runner_host.network import NETNS_LINK_DOWN, UNAVAILABLE, veth_prefix
from services.runner_host.relay import Relay
from tests.support.system import REPO_ROOT, wait_until

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(os.geteuid() != 0, reason="containment needs root (cgroups, netns)"),
]

NOISY = str(REPO_ROOT / "tests" / "support" / "noisy_child.py")
AVAILABLE = (
    [CGROUP_V2_FREEZE] * (v2_root() is not None)
    + [CGROUP_V1_FREEZER] * (v1_freezer_root() is not None)
    + [SIGSTOP]
)


def _host_id() -> str:
    return f"t{uuid.uuid4().hex[:8]}"


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def _leftovers(containment: Containment) -> list[str]:
    found: list[str] = []
    for root in (v2_root(), v1_freezer_root()):
        if root is not None:
            found += [str(p) for p in root.glob(f"{containment.prefix}*")]
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    found += [line for line in netns.splitlines() if line.startswith(containment.prefix)]
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    found += [line for line in links.splitlines() if veth_prefix(containment.prefix) in line]
    return found


class Listener:
    """A UDP socket on the host end of the child's veth."""

    def __init__(self, address: str) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((address, 0))
        self.sock.setblocking(False)
        self.port = int(self.sock.getsockname()[1])

    def drain(self) -> int:
        count = 0
        while True:
            try:
                self.sock.recv(64)
            except BlockingIOError:
                return count
            count += 1


@pytest.fixture
def started(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[ManagedChild, Path, Listener]]:
    mechanism: str = request.param
    containment = Containment(_host_id(), freezer=mechanism)
    assert containment.freezer_mechanism == mechanism
    child = ManagedChild(containment).prepare()
    assert child.network.mechanism == NETNS_LINK_DOWN and child.network.host_address
    listener = Listener(child.network.host_address)
    out = tmp_path / "out.txt"
    child.start([sys.executable, NOISY, str(out), child.network.host_address, str(listener.port)], os.environ)
    try:
        wait_until(lambda: _lines(out) > 20 and listener.drain() > 0, 10, "the child writing and sending")
        yield child, out, listener
    finally:
        child.close()
        listener.sock.close()
        assert _leftovers(containment) == []


@pytest.mark.parametrize("started", AVAILABLE, indirect=True)
def test_qua1_freeze_stops_the_file_and_sever_stops_the_packets(
    started: tuple[ManagedChild, Path, Listener],
) -> None:
    """QUA-1: after contain() the file stops growing (within the measured time) and no packet arrives."""
    child, out, listener = started
    times = child.contain()
    at_frozen = _lines(out)
    listener.drain()  # datagrams sent before the freeze may still be queued in our socket
    time.sleep(0.3)
    assert _lines(out) == at_frozen, "the file grew after the tree was frozen"
    assert listener.drain() == 0, "a datagram arrived after severing"
    assert times.freezer == child.freezer.mechanism and times.network == NETNS_LINK_DOWN
    assert 0 < times.to_frozen_s <= times.to_severed_s < 1.0 and not times.error
    assert child.contain() is times  # idempotent
    # A frozen tree is killed by force_stop (kill queued, then thawed) and reaped.
    code = child.force_stop(5)
    assert code == -signal.SIGKILL
    assert child.freezer.members() == set()


@pytest.mark.parametrize("started", [AVAILABLE[0]], indirect=True)
def test_qua1_sever_alone_cuts_packets_while_the_child_runs(
    started: tuple[ManagedChild, Path, Listener],
) -> None:
    """Severing, without freezing: the child keeps writing (it is alive) but nothing reaches the host."""
    child, out, listener = started
    child.network.sever()
    listener.drain()
    before = _lines(out)
    time.sleep(0.3)
    assert _lines(out) > before + 10, "the child should still be running"
    assert listener.drain() == 0, "a datagram crossed a severed link"


@pytest.mark.parametrize("started", [AVAILABLE[0]], indirect=True)
def test_qua1_thaw_resumes_a_frozen_child(started: tuple[ManagedChild, Path, Listener]) -> None:
    child, out, _ = started
    child.freezer.freeze()
    frozen = _lines(out)
    time.sleep(0.1)
    assert _lines(out) == frozen
    child.freezer.thaw()
    wait_until(lambda: _lines(out) > frozen + 10, 5, "the thawed child writing again")


def test_qua1_sigstop_fallback_is_used_and_reported_without_cgroups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the probe saying no cgroup hierarchy exists, the host falls back to SIGSTOP and says so."""
    monkeypatch.setattr(freezer_module, "v2_root", lambda *a, **k: None)
    monkeypatch.setattr(freezer_module, "v1_freezer_root", lambda *a, **k: None)
    assert probe_freezers("auto")[0] == SIGSTOP
    containment = Containment(_host_id(), network="none")
    assert (containment.freezer_mechanism, containment.network_mechanism) == (SIGSTOP, UNAVAILABLE)
    child = ManagedChild(containment)
    out = tmp_path / "out.txt"
    child.start([sys.executable, NOISY, str(out)], os.environ)
    try:
        wait_until(lambda: _lines(out) > 20, 10, "the child writing")
        times = child.contain()
        assert (times.freezer, times.network) == (SIGSTOP, UNAVAILABLE)
        frozen = _lines(out)
        time.sleep(0.3)
        assert _lines(out) == frozen
        assert child.force_stop(5) == -signal.SIGKILL
    finally:
        child.close()
    assert _leftovers(containment) == []


_FAKE_HOST = """
import os, sys, time
from services.runner_host.child import Containment, ManagedChild
child = ManagedChild(Containment(sys.argv[1])).prepare()
child.start([sys.executable, sys.argv[2], sys.argv[3]], os.environ)
time.sleep(0.3)
child.contain()
print("contained", flush=True)
time.sleep(60)
"""


def test_stale_containment_of_a_sigkilled_host_is_removed_at_start_up(tmp_path: Path) -> None:
    """A host SIGKILLed with a frozen child leaves a cgroup and a namespace: the next start with
    the same host id removes them (and the child died with its host: PDEATHSIG)."""
    host_id = _host_id()
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    host = subprocess.Popen(
        [sys.executable, "-c", _FAKE_HOST, host_id, NOISY, str(tmp_path / "out.txt")],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert host.stdout is not None and host.stdout.readline().strip() == "contained"
    finally:
        host.send_signal(signal.SIGKILL)
        host.wait(10)
    successor = Containment(host_id)
    assert _leftovers(successor), "the SIGKILLed host should have left its containment behind"
    # The real host process removes them at start-up, before anything else (here its claim then
    # fails: nothing listens at its API URL).
    closed_port = _free_port()
    started = subprocess.run(
        [sys.executable, "-m", "services.runner_host", "--run-id", "run_none", "--", "true"],
        env={
            **env,
            "TENURE_RUNNER_HOST_ID": host_id,
            "TENURE_RUNNER_HOST_API_URL": f"http://127.0.0.1:{closed_port}",
            "TENURE_RUNNER_HOST_HEALTH_PORT": "0",
        },
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert started.returncode == 1 and '"not-claimed"' in started.stdout, started.stderr[-2000:]
    assert "removed stale containment" in started.stderr
    assert _leftovers(successor) == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_FETCHER = """
import sys, time, urllib.request
url, out = sys.argv[1], sys.argv[2]
while True:
    try:
        with urllib.request.urlopen(url, timeout=0.3) as answer:
            line = "ok " + answer.read().decode()
    except Exception as exc:
        line = "err " + type(exc).__name__
    with open(out, "a") as f:
        f.write(line + "\\n")
    time.sleep(0.02)
"""


def test_the_child_reaches_the_api_through_the_relay_until_severed(tmp_path: Path) -> None:
    """A child in its own namespace reaches a server on the host's loopback only through the
    relay on the host end of its veth; once the link is severed it reaches nothing."""

    class Hello(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"hello")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    containment = Containment(_host_id())
    child = ManagedChild(containment).prepare()
    assert child.network.host_address
    relay = Relay(child.network.host_address, f"http://127.0.0.1:{server.server_address[1]}/hi").start()
    out = tmp_path / "fetch.txt"
    try:
        assert relay.url.endswith("/hi") and child.network.host_address in relay.url
        child.start([sys.executable, "-c", _FETCHER, relay.url, str(out)], os.environ)
        wait_until(lambda: out.exists() and "ok hello" in out.read_text(), 10, "a fetch through the relay")
        child.network.sever()
        time.sleep(0.5)  # fetches in flight at the sever end; then only failures
        seen = len(out.read_text().splitlines())
        wait_until(lambda: len(out.read_text().splitlines()) > seen + 3, 10, "more fetch attempts")
        after = out.read_text().splitlines()[seen:]
        assert after and all(line.startswith("err") for line in after), after
    finally:
        child.close()
        relay.close()
        server.shutdown()
    assert _leftovers(containment) == []
