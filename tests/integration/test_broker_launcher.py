"""The project's own Kafka launcher (services.common.broker) against a real broker process."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from services.common import broker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

API_VERSIONS, PRODUCE, FETCH, CREATE_TOPICS = 18, 0, 1, 19


def test_fixture_broker_accepts_tcp_and_answers_api_versions(kafka_bootstrap: str) -> None:
    host, port = kafka_bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5):
        pass
    supported = broker.api_versions(host, int(port))
    # A Kafka 4.x broker speaks ApiVersions up to v4 and serves the APIs Tenure relies on.
    assert supported[API_VERSIONS][1] >= 3
    assert {PRODUCE, FETCH, CREATE_TOPICS} <= supported.keys()


def test_second_ensure_jars_is_a_cached_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = broker.ensure_jars()  # fetched at most once (the fixture or an earlier run did it)
    assert len(list(cache.glob("*.jar"))) >= 40

    def no_maven(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"ensure_jars ran a subprocess on a complete cache: {args}")

    monkeypatch.setattr(subprocess, "run", no_maven)
    began = time.monotonic()
    assert broker.ensure_jars() == cache
    assert time.monotonic() - began < 0.5


def test_ensure_jars_refetches_when_the_marker_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[list[str]] = []

    def fake_maven(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        calls.append(command)
        output_dir = Path(next(a for a in command if a.startswith("-DoutputDirectory=")).split("=", 1)[1])
        output_dir.mkdir(parents=True)
        (output_dir / "kafka-clients-x.jar").write_bytes(b"")
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(subprocess, "run", fake_maven)
    cache = tmp_path / "libs"
    assert broker.ensure_jars(cache) == cache
    assert broker.ensure_jars(cache) == cache  # second call: marker present, no Maven
    assert len(calls) == 1
    assert (cache / broker.JARS_MARKER).is_file()
    assert not list(tmp_path.glob("libs.fetch-*"))  # staging folder renamed, not left behind


def _process_gone(pid: int) -> bool:
    """True once ``pid`` no longer exists or is a zombie waiting for init to reap it.

    A broker started by the CLI is re-parented to init after the CLI exits, so right after
    `stop` it can briefly linger as a zombie: it has exited and released its ports by then.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"


def _stubborn_child() -> subprocess.Popen[bytes]:
    code = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "sys.stdout.write('ready\\n'); sys.stdout.flush()\n"
        "time.sleep(60)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert child.stdout is not None and child.stdout.readline() == b"ready\n"
    return child


def test_stop_escalates_to_sigkill_after_the_grace_period() -> None:
    child = _stubborn_child()
    began = time.monotonic()
    outcome = broker.stop_process(child.pid, grace_seconds=1.0, child=child)
    elapsed = time.monotonic() - began
    assert outcome == "killed"
    assert child.returncode == -signal.SIGKILL
    assert 1.0 <= elapsed < 5.0  # waited the full grace period, then did not linger


def test_stop_escalation_works_by_pid_alone_for_a_foreign_process() -> None:
    # `stop` from another shell knows only the pid from broker.json, not a Popen object.
    child = _stubborn_child()
    try:
        assert broker.stop_process(child.pid, grace_seconds=0.5) == "killed"
    finally:
        child.wait(timeout=5)
    assert child.returncode == -signal.SIGKILL


def test_stop_of_a_cooperative_process_is_a_plain_sigterm() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert broker.stop_process(child.pid, grace_seconds=10.0, child=child) == "terminated"
    assert child.returncode == -signal.SIGTERM
    assert broker.stop_process(child.pid, grace_seconds=10.0, child=child) == "already-exited"


def test_launcher_start_on_explicit_port_then_stop_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    state_dir, port = tmp_path / "kafka", broker.free_port()
    handle = broker.start_broker(port=port, state_dir=state_dir, data_dir=state_dir / "data")
    try:
        assert handle.bootstrap_servers == f"127.0.0.1:{port}"
        assert handle.pid is not None and handle.owned
        assert broker.api_versions("127.0.0.1", port)[API_VERSIONS][0] == 0
        assert broker.resolve_bootstrap(state_dir) == handle.bootstrap_servers
        status = broker.broker_status(state_dir)
        assert status is not None and status["pid"] == handle.pid
        # A second start with the same state dir reuses the running broker instead of a new JVM.
        again = broker.start_broker(state_dir=state_dir)
        assert (again.pid, again.bootstrap_servers, again.owned) == (handle.pid, f"127.0.0.1:{port}", False)
        assert again.stop() == "not-owned" and handle.running()
    finally:
        outcome = handle.stop(grace_seconds=15.0)
    assert outcome == "terminated"  # SIGTERM sufficed: Kafka shut down cleanly
    pid = handle.pid
    assert _process_gone(pid)
    assert broker.broker_status(state_dir) is None
    assert not (state_dir / "broker.json").exists()
    with pytest.raises(broker.BrokerNotRunningError):
        broker.resolve_bootstrap(state_dir)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def _cli(command: str, state_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TENURE_STATE_DIR": str(state_dir), "PYTHONPATH": str(broker.REPO_ROOT)}
    env.pop("KAFKA_BOOTSTRAP_SERVERS", None)
    return subprocess.run(
        [sys.executable, "-m", "services.common.broker", command],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def test_cli_start_status_stop_work_across_processes(tmp_path: Path) -> None:
    started = _cli("start", tmp_path)
    assert started.returncode == 0, started.stderr
    line = next(x for x in started.stdout.splitlines() if x.startswith("KAFKA_BOOTSTRAP_SERVERS="))
    address = line.split("=", 1)[1]
    state_dir = tmp_path / "kafka"
    status = broker.broker_status(state_dir)
    try:
        assert status is not None and status["bootstrap_servers"] == address
        host, port = address.rsplit(":", 1)
        assert API_VERSIONS in broker.api_versions(host, int(port))
        reported = _cli("status", tmp_path)
        assert reported.returncode == 0 and address in reported.stdout
        assert _cli("start", tmp_path).stdout.strip() == line  # reuses, prints the same address
    finally:
        stopped = _cli("stop", tmp_path)
    assert stopped.returncode == 0, stopped.stderr
    assert "terminated" in stopped.stderr
    assert _process_gone(int(str(status["pid"])))
    assert _cli("status", tmp_path).returncode == 3


def test_start_on_a_busy_port_fails_with_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        with pytest.raises(broker.BrokerStartError, match=f"127.0.0.1:{port} is not free"):
            broker.start_broker(port=port, state_dir=tmp_path / "kafka")
    assert not (tmp_path / "kafka" / "broker.json").exists()


def test_env_bootstrap_wins_and_nothing_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "kafka.example:9092")
    handle = broker.start_broker(state_dir=tmp_path / "kafka")
    assert (handle.bootstrap_servers, handle.pid, handle.owned) == ("kafka.example:9092", None, False)
    assert broker.resolve_bootstrap(tmp_path / "kafka") == "kafka.example:9092"
    assert not (tmp_path / "kafka").exists()


def _log_seconds(line_part: str, log_file: Path) -> float:
    import datetime as dt

    for line in log_file.read_text(errors="replace").splitlines():
        if line_part in line:
            return dt.datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    raise AssertionError(f"no {line_part!r} in {log_file}")


def test_a_sigkilled_broker_restarts_without_waiting_out_its_old_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 10: a SIGKILLed broker never deregisters, and the restarted controller refused the new
    incarnation until the old registration's session (broker.session.timeout.ms, 9 s by default)
    expired: ~10 s from controller activation to "Kafka Server started". Now a few seconds; the
    bound (7 s) is below what the old session alone took, whatever the machine's load."""
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    state_dir, port = tmp_path / "kafka", broker.free_port()
    handle = broker.start_broker(port=port, state_dir=state_dir, data_dir=state_dir / "data")
    try:
        first = broker.broker_status(state_dir)
        assert first is not None and handle.pid is not None
        os.kill(handle.pid, signal.SIGKILL)
        handle.stop(grace_seconds=1.0)  # reaps it
        began = time.monotonic()
        handle = broker.start_broker(port=port, state_dir=state_dir, data_dir=state_dir / "data")
        took = time.monotonic() - began
        log_file = state_dir / "broker.log"
        activation = _log_seconds("Performing controller activation", log_file)
        started = _log_seconds(broker.STARTED_LOG_LINE, log_file)
        assert started - activation < 7.0, f"{started - activation:.1f}s after activation (took {took:.1f}s)"
        second = broker.broker_status(state_dir)
        # The same controller port: the voter set written at format time stays true.
        assert second is not None and second["controller_port"] == first["controller_port"]
        assert second["port"] == port
    finally:
        handle.stop()
