"""The managed runner host against a fake of the API's HTTP contract (httpx.MockTransport).

The fake speaks claim / heartbeat / report (the runner SDK's calls) and the quarantine contract:
the long-poll GET /runs/{id}/quarantine?afterVersion&waitMs and POST .../quarantine/stages. The
children are real (short-lived) processes; the freezer and the network are recording fakes where
the order of the stages is what is tested, the real SIGSTOP fallback where a child must stop.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.common.backoff import full_jitter_s
from services.runner_host.child import Containment
from services.runner_host.control import QuarantineChannel, QuarantineUnavailable
from services.runner_host.freezer import Freezer, FreezerFactory
from services.runner_host.host import HostConfig, HostResult, RunnerHost
from services.runner_host.network import Network
from services.runner_sdk.client import TenureClient
from services.runner_sdk.errors import RunNotFound

pytestmark = pytest.mark.timeout(30)

API = "http://api.tenure.test"
RUN = "run-q1"


class FakeApi:
    """Claim, heartbeat, report, and the quarantine long-poll and stage reports."""

    def __init__(self, events: list[str]) -> None:
        self.events = events
        self.cond = threading.Condition()
        self.status, self.version = "none", 0
        self.stop: dict[str, Any] | None = None
        self.reports: list[dict[str, Any]] = []
        self.stages: list[dict[str, Any]] = []
        self.stage_auth: list[str] = []
        self.stage_failures = 0  # answer this many stage reports with 503 first
        self.quarantine_route = True
        self.missing_claims = 0  # answer this many claims with 404 run-not-found first
        self.lease_revoked = False  # heartbeats answered 409 (a quarantine's takeover)
        self.watch_lags = False  # the long-poll (waitMs > 500) never sees the quarantine

    def quarantine(self) -> None:
        with self.cond:
            self.status, self.version = "quarantined", self.version + 1
            self.cond.notify_all()

    def handle(self, request: httpx.Request) -> httpx.Response:
        path, now = request.url.path, int(time.time() * 1000)
        if request.method == "POST" and path == f"/runs/{RUN}/attempts" and self.missing_claims > 0:
            self.missing_claims -= 1
            self.events.append("claim-404")
            return httpx.Response(404, json={"type": "/problems/run-not-found", "status": 404})
        if request.method == "POST" and path == f"/runs/{RUN}/attempts":
            return httpx.Response(
                201,
                json={
                    "runId": RUN,
                    "attemptId": f"{RUN}-1",
                    "attemptNumber": 1,
                    "leaseId": "lease-1",
                    "epoch": 1,
                    "expiresAt": now + 10_000,
                    "leaseSeconds": 10,
                    "heartbeatIntervalSeconds": 1,
                    "serverTime": now,
                    "assignment": {"executionSpec": {}, "credential": "per-run-secret"},
                },
            )
        if request.method == "POST" and path.endswith("/heartbeat") and self.lease_revoked:
            return httpx.Response(
                409, json={"type": "/problems/stale-epoch", "status": 409, "detail": "taken"}
            )
        if request.method == "POST" and path.endswith("/heartbeat"):
            body = json.loads(request.content)
            stop = self.stop or {}
            return httpx.Response(
                200,
                json={
                    "attemptId": f"{RUN}-1",
                    "epoch": 1,
                    "sequence": body["sequence"],
                    "expiresAt": now + 10_000,
                    "serverTime": now,
                    "certainty": "active",
                    "runStatus": "cancelling" if self.stop else "running",
                    "stopRequested": self.stop is not None,
                    "stopKind": stop.get("kind"),
                    "stopGraceUntil": stop.get("graceUntil"),
                },
            )
        if request.method == "POST" and path.endswith("/report"):
            self.events.append("report")
            self.reports.append(json.loads(request.content))
            return httpx.Response(200, json={"runId": RUN, "status": "done"})
        if path == f"/runs/{RUN}/quarantine" and request.method == "GET":
            if not self.quarantine_route:
                return httpx.Response(404, json={"type": "/problems/not-found", "status": 404})
            after = int(request.url.params["afterVersion"])
            wait_ms = int(request.url.params["waitMs"])
            deadline = time.monotonic() + wait_ms / 1000
            if self.watch_lags and wait_ms > 500:
                time.sleep(wait_ms / 1000)
                return httpx.Response(200, json={"runId": RUN, "status": "none", "version": 0, "stages": {}})
            with self.cond:
                while self.version <= after and time.monotonic() < deadline:
                    self.cond.wait(deadline - time.monotonic())
                return httpx.Response(
                    200,
                    json={"runId": RUN, "status": self.status, "version": self.version, "trigger": None,
                          "stages": {"suspended": None, "revoked": None, "severed": None}},
                )  # fmt: skip
        if path == f"/runs/{RUN}/quarantine/stages" and request.method == "POST":
            if self.stage_failures > 0:
                self.stage_failures -= 1
                self.events.append("stage-503")
                return httpx.Response(503, headers={"Retry-After": "1"}, json={"status": 503})
            body = json.loads(request.content)
            self.events.append(f"stage:{body['stage']}")
            self.stages.append(body)
            self.stage_auth.append(request.headers.get("authorization", ""))
            return httpx.Response(202, json={"accepted": True})
        return httpx.Response(404, json={"type": "/problems/not-found", "status": 404})


class RecordingFreezer(Freezer):
    mechanism = "cgroup-v2-freeze"

    def __init__(self, events: list[str]) -> None:
        super().__init__()
        self.events = events

    def freeze(self, timeout_s: float = 2.0) -> None:
        self.events.append("freeze")
        self.frozen = True

    def thaw(self) -> None:
        self.frozen = False

    def members(self) -> set[int]:
        return set()


class RecordingNetwork(Network):
    mechanism = "netns-link-down"

    def __init__(self, events: list[str]) -> None:
        super().__init__()
        self.events = events

    def sever(self) -> None:
        self.events.append("sever")
        self.severed = True


def recording(events: list[str]) -> Containment:
    def freezers(_: str) -> tuple[str, FreezerFactory]:
        return "cgroup-v2-freeze", lambda _name: RecordingFreezer(events)

    def networks(_: str) -> tuple[str, Callable[[str, str], Network]]:
        return "netns-link-down", lambda _n, _p: RecordingNetwork(events)

    return Containment("unit", freezer_probe=freezers, network_probe=networks)


def _sigstop(_: list[str]) -> Containment:
    return Containment("unit", freezer="sigstop", network="none")


class Harness:
    def __init__(
        self, tmp: Path, containment: Callable[[list[str]], Containment], command: list[str], **config: Any
    ) -> None:
        self.events: list[str] = []
        self.api = FakeApi(self.events)
        transport = httpx.MockTransport(self.api.handle)
        self.sleeps: list[float] = []
        self.client = TenureClient(API, "http://gateway.tenure.test", "runner-key", transport=transport)
        self.channel = QuarantineChannel(
            API, "runner-key", "unit", transport=transport, jitter=lambda: 0.5, sleep=self.sleeps.append
        )
        self.config = HostConfig(
            run_id=RUN,
            host_id="unit",
            command=tuple(command),
            api_url=API,
            gateway_url="http://gateway.tenure.test",
            workdir=tmp,
            poll_wait_ms=2_000,
            base_env={"PATH": os.environ.get("PATH", ""), "TENURE_RUNNER_HOST_API_KEY": "host-secret"},
            **config,
        )
        self.host = RunnerHost(self.config, containment(self.events), self.client, self.channel)
        self.result: HostResult | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        self.result = self.host.run()

    def start(self) -> Harness:
        self.thread.start()
        return self

    def join(self, timeout_s: float = 15) -> HostResult:
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), "the host did not finish"
        assert self.result is not None
        return self.result


@pytest.fixture
def harnesses() -> Iterator[list[Harness]]:
    made: list[Harness] = []
    yield made
    for harness in made:
        harness.host.request_shutdown()
        harness.thread.join(10)


def _sleeper() -> list[str]:
    return [sys.executable, "-c", "import time; time.sleep(30)"]


def _until(predicate: Callable[[], object], timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_qua1_quarantine_freezes_then_severs_then_reports_the_stages_in_order(
    tmp_path: Path, harnesses: list[Harness]
) -> None:
    """QUA-1: the long-poll's "quarantined" -> freeze FIRST, then sever, then the two stage reports
    (suspended, severed) with the runner's own key; no outcome is reported for the run."""
    h = Harness(tmp_path, recording, _sleeper())
    harnesses.append(h.start())
    _until(lambda: h.host.child is not None and h.host.child.process is not None)
    h.api.quarantine()
    assert h.host.wait_contained(5)
    _until(lambda: len(h.api.stages) == 2)
    assert h.events == ["freeze", "sever", "stage:suspended", "stage:severed"]
    assert [(s["stage"], s["mechanism"], s["hostId"]) for s in h.api.stages] == [
        ("suspended", "cgroup-v2-freeze", "unit"),
        ("severed", "netns-link-down", "unit"),
    ]
    assert all(s["completedAt"].endswith("Z") and "T" in s["completedAt"] for s in h.api.stages)
    assert h.api.stage_auth == ["Bearer runner-key"] * 2
    h.host.request_shutdown()
    result = h.join()
    assert result.outcome == "quarantined" and not result.reported
    assert h.api.reports == [], "a quarantined run gets no outcome (and so no compensation)"
    assert (
        result.containment is not None and result.containment.to_frozen_s <= result.containment.to_severed_s
    )
    assert [s.accepted for s in result.stages] == [True, True]


def test_qua1_stage_report_is_retried_with_full_jitter_on_503() -> None:
    events: list[str] = []
    api = FakeApi(events)
    api.stage_failures = 2
    sleeps: list[float] = []
    channel = QuarantineChannel(
        API,
        "runner-key",
        "unit",
        transport=httpx.MockTransport(api.handle),
        retry_base_s=0.1,
        retry_cap_s=5.0,
        jitter=lambda: 0.5,
        sleep=sleeps.append,
    )
    report = channel.report_stage(RUN, "suspended", "cgroup-v1-freezer", time.time())
    assert report.accepted and report.attempts == 3
    assert events == ["stage-503", "stage-503", "stage:suspended"]
    # The one backoff (BRK-3): uniform(0, min(cap, base * 2**k)), here with the draw pinned at 0.5.
    assert sleeps == [full_jitter_s(0, 0.1, 5.0, 0.5), full_jitter_s(1, 0.1, 5.0, 0.5)]


def test_stage_report_gives_up_on_a_definite_refusal_without_retrying() -> None:
    def refuse(_: httpx.Request) -> httpx.Response:
        return httpx.Response(403, json={"type": "/problems/forbidden", "status": 403})

    sleeps: list[float] = []
    channel = QuarantineChannel(API, "k", "unit", transport=httpx.MockTransport(refuse), sleep=sleeps.append)
    report = channel.report_stage(RUN, "severed", "netns-link-down", time.time())
    assert not report.accepted and report.attempts == 1 and sleeps == []
    assert "403" in report.detail


def test_quarantine_watch_without_the_route_keeps_retrying(tmp_path: Path) -> None:
    """An API without the quarantine routes yet (404) is 'unavailable', never 'not quarantined'."""
    api = FakeApi([])
    api.quarantine_route = False
    channel = QuarantineChannel(API, None, "unit", transport=httpx.MockTransport(api.handle))
    with pytest.raises(QuarantineUnavailable, match="404"):
        channel.poll(RUN, 0, 0)


def test_exe7_cancel_sigterms_then_force_stops_after_the_grace_and_confirms(
    tmp_path: Path, harnesses: list[Harness]
) -> None:
    """EXE-7: a stop request on a heartbeat answer -> SIGTERM; a child that ignores it is killed
    after the grace period; the stop is confirmed with the terminal report `cancelled`."""
    ready = tmp_path / "ready"
    stubborn = [
        sys.executable,
        "-c",
        "import signal, time, pathlib, sys; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        "pathlib.Path(sys.argv[1]).write_text('x'); time.sleep(60)",
        str(ready),
    ]
    h = Harness(tmp_path, _sigstop, stubborn, stop_grace_s=0.5)
    harnesses.append(h.start())
    _until(ready.exists)
    began = time.monotonic()
    h.api.stop = {"kind": "cancel", "graceUntil": int(time.time() * 1000) + 30_000}
    result = h.join()
    assert result.outcome == "cancelled" and result.reported and result.forced
    assert result.exit_code == -9
    assert time.monotonic() - began >= 0.5  # the grace period was given before the SIGKILL
    assert [r["outcome"] for r in h.api.reports] == ["cancelled"]


def test_exe7_a_child_that_obeys_sigterm_is_not_killed(tmp_path: Path, harnesses: list[Harness]) -> None:
    ready = tmp_path / "ready"
    script = "import time, pathlib, sys; pathlib.Path(sys.argv[1]).write_text('x'); time.sleep(60)"
    polite = [sys.executable, "-c", script, str(ready)]
    h = Harness(tmp_path, _sigstop, polite, stop_grace_s=10)
    harnesses.append(h.start())
    _until(ready.exists)
    h.api.stop = {"kind": "cancel", "graceUntil": None}
    result = h.join()
    assert (result.outcome, result.forced, result.exit_code) == ("cancelled", False, -15)


@pytest.mark.parametrize(("code", "outcome", "error"), [(0, "succeeded", ""), (3, "failed", "EXIT_3")])
def test_child_exit_reports_the_attempts_outcome(
    tmp_path: Path, harnesses: list[Harness], code: int, outcome: str, error: str
) -> None:
    """The child's environment carries the run, attempt, API and per-run credential, and none of
    the host's own TENURE_* settings (its API key stays with the host)."""
    dump = tmp_path / "env.json"
    script = (
        "import json, os, sys; json.dump(dict(os.environ), open(sys.argv[1], 'w'));"
        "open(os.environ['TENURE_RESULT_MANIFEST'], 'w').write('[]'); sys.exit(int(sys.argv[2]))"
    )
    h = Harness(
        tmp_path,
        _sigstop,
        [sys.executable, "-c", script, str(dump), str(code)],
    )
    harnesses.append(h.start())
    result = h.join()
    assert (result.outcome, result.exit_code, result.reported) == (outcome, code, True)
    assert [(r["outcome"], r["errorCode"]) for r in h.api.reports] == [(outcome, error)]
    if outcome == "succeeded":
        assert h.api.reports[0]["manifest"] == []
    env = json.loads(dump.read_text())
    assert env["TENURE_RUN_ID"] == RUN and env["TENURE_ATTEMPT_ID"] == f"{RUN}-1"
    assert env["TENURE_API_URL"] == API and env["TENURE_LEASE_EPOCH"] == "1"
    assert env["TENURE_RUN_CREDENTIAL"] == "per-run-secret"
    assert "TENURE_RUNNER_HOST_API_KEY" not in env


def test_a_host_id_that_would_name_files_badly_is_refused() -> None:
    with pytest.raises(ValueError, match="host id"):
        Containment("../etc", freezer="sigstop", network="none")


def test_claim_wait_asks_again_until_the_run_is_submitted(tmp_path: Path, harnesses: list[Harness]) -> None:
    """`--claim-wait`: a run not submitted yet (404) is claimed again after a full-jitter wait."""
    h = Harness(tmp_path, _sigstop, [sys.executable, "-c", "pass"], claim_wait_s=30)
    h.api.missing_claims = 2
    harnesses.append(h.start())
    result = h.join()
    assert h.events[:2] == ["claim-404", "claim-404"]
    assert (result.outcome, result.reported) == ("succeeded", True)


def test_without_claim_wait_a_missing_run_is_an_error(tmp_path: Path) -> None:
    h = Harness(tmp_path, _sigstop, [sys.executable, "-c", "pass"])
    h.api.missing_claims = 1
    with pytest.raises(RunNotFound):
        h.host.run()


def test_qua1_a_lease_lost_to_a_quarantine_is_contained_not_sigtermed(
    tmp_path: Path, harnesses: list[Harness]
) -> None:
    """The quarantine's lease takeover may reach a heartbeat before the long-poll answers: the
    host asks for the quarantine before it would SIGTERM (a handler could act), and contains."""
    ready, termed = tmp_path / "ready", tmp_path / "termed"
    script = (
        "import signal, time, pathlib, sys\n"
        "signal.signal(signal.SIGTERM, lambda *a: pathlib.Path(sys.argv[2]).write_text('x'))\n"
        "pathlib.Path(sys.argv[1]).write_text('x')\n"
        "while True: time.sleep(0.01)\n"
    )
    h = Harness(tmp_path, recording, [sys.executable, "-c", script, str(ready), str(termed)])
    h.api.watch_lags = True
    harnesses.append(h.start())
    _until(ready.exists)
    h.api.quarantine()
    h.api.lease_revoked = True
    assert h.host.wait_contained(10)
    _until(lambda: len(h.api.stages) == 2)
    assert h.events[:2] == ["freeze", "sever"]
    time.sleep(0.2)
    assert not termed.exists(), "the child was SIGTERMed before it was contained"
    h.host.request_shutdown()
    assert h.join().outcome == "quarantined" and h.api.reports == []
