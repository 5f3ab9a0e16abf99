"""Trigger -> child frozen and trigger -> network severed, on the managed runner host (issue 14, QUA-3).

local   from the host's receipt of the quarantine instruction: per trial a fresh child (it
        appends to a file and sends UDP to the host end of its veth) in its own cgroup and
        network namespace; the clock starts where the host's quarantine watch starts it (the
        long-poll's answer in hand) and `ManagedChild.contain` runs the host's own code path:
        freeze, confirmed, then `ip link set <veth> down`. Each trial checks the file stopped
        growing. Once per freezer mechanism available here (v2 cgroup.freeze, v1 freezer,
        the SIGSTOP fallback).
e2e     from just before the operator's POST /runs/{id}/quarantine, through the API, the
        quarantine processor, the host's long-poll, to the host's confirmed freeze and sever
        (CLOCK_MONOTONIC is machine-wide, so the host's readings compare with the bench's).
        Only when services/command_api/routes_quarantine.py exists (or with --e2e).

Prints p50 / p99 / max (nearest rank) per path; `--out FILE` writes the table with its context.
Needs root (cgroups, `ip netns`).

    .venv/bin/python -m bench.runner_host [--trials 50] [--e2e-trials 10] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path

import httpx

from bench.foundation import Service, percentile, say, service_env, spawn, wait_for_api
from services.common.broker import BrokerHandle, free_port, start_broker, stop_process
from services.common.kafka import create_topics
from services.common.settings import repo_root
from services.common.topics import TOPICS
from services.runner_host.child import Containment, ManagedChild
from services.runner_host.freezer import CGROUP_V1_FREEZER, CGROUP_V2_FREEZE, SIGSTOP

NOISY = str(repo_root() / "tests" / "support" / "noisy_child.py")
ROUTES = repo_root() / "services" / "command_api" / "routes_quarantine.py"
KEYS = (
    "bench-sub=bench:submitter,bench-runner=bench-runner:runner,bench-op=bench-ops:operator,"
    "bench-svc=bench-svc:service"
)


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def _writing(path: Path) -> bool:
    return _lines(path) > 5


def _wait(predicate: Callable[[], object], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not within {timeout_s}s")
        time.sleep(0.01)


def measure_local(mechanism: str, trials: int, workdir: Path) -> tuple[list[float], list[float], str]:
    containment = Containment(f"b{uuid.uuid4().hex[:8]}", freezer=mechanism)
    frozen, severed = [], []
    for n in range(trials):
        child = ManagedChild(containment).prepare()
        out = workdir / f"{mechanism}-{n}.txt"
        try:
            # Datagrams to the discard port of the host end of its veth: the child's traffic.
            target = [child.network.host_address or "127.0.0.1", "9"]
            child.start([sys.executable, NOISY, str(out), *target], os.environ, stdout=subprocess.DEVNULL)
            _wait(partial(_writing, out), 10, "the child writing")
            received = time.monotonic()  # where the host's watch stamps the instruction's receipt
            times = child.contain(received)
            if times.error:
                raise RuntimeError(f"containment failed: {times.error}")
            still = _lines(out)
            time.sleep(0.02)
            if _lines(out) != still:
                raise RuntimeError(f"{mechanism}: the file grew after the freeze (trial {n})")
            frozen.append(times.to_frozen_s * 1000)
            severed.append(times.to_severed_s * 1000)
        finally:
            child.close()
    return frozen, severed, containment.network_mechanism


def _row(path: str, values: list[float]) -> str:
    p50, p99, top = (percentile(values, q) for q in (50, 99, 100))
    return f"| {path} | {len(values)} | {p50:.2f} ms | {p99:.2f} ms | {top:.2f} ms |"


class E2E:
    """Coordinator, projector, API and quarantine processor on a broker of their own."""

    def __init__(self, workdir: Path, bootstrap: str) -> None:
        self.workdir = workdir
        port = free_port()
        self.env = service_env(
            bootstrap,
            workdir / "state",
            TENURE_API_PORT=str(port),
            TENURE_API_KEYS=KEYS,
            TENURE_SERVICE_KEY="bench-svc",
            TENURE_COORDINATOR_HEALTH_PORT="0",
            TENURE_PROJECTIONS_HEALTH_PORT="0",
            TENURE_QUARANTINE_HEALTH_PORT="0",
        )
        self.url = f"http://127.0.0.1:{port}"
        self.services: list[Service] = [
            spawn("lease_coordinator", "services.lease_coordinator", workdir / "coordinator", self.env),
            spawn("projections", "services.projections", workdir / "projections", self.env),
        ]
        _wait((workdir / "state" / "projections" / "run_views" / "CURRENT").exists, 60, "the views store")
        self.services.append(spawn("command_api", "services.command_api", workdir / "api", self.env))
        self.services.append(spawn("quarantine", "services.quarantine", workdir / "quarantine", self.env))
        wait_for_api(self.url, self.services[2])

    def trial(self, n: int) -> tuple[float, float, float, float, float]:
        sub = {"Authorization": "Bearer bench-sub"}
        created = httpx.post(
            f"{self.url}/runs",
            headers={**sub, "Idempotency-Key": f"bench-rh-{uuid.uuid4()}"},
            json={"tenant": "bench", "executionSpec": {"n": n}, "timeoutSeconds": 600},
            timeout=30,
        )
        created.raise_for_status()
        run_id = created.json()["runId"]
        out = self.workdir / f"e2e-{n}.txt"
        host_out = self.workdir / f"host-{n}.out"
        env = {
            **self.env,
            "TENURE_RUNNER_HOST_ID": f"b{uuid.uuid4().hex[:8]}",
            "TENURE_RUNNER_HOST_API_URL": self.url,
            "TENURE_RUNNER_HOST_API_KEY": "bench-runner",
            "TENURE_RUNNER_HOST_HEALTH_PORT": "0",
        }
        argv = [sys.executable, "-m", "services.runner_host", "--run-id", run_id, "--lease-seconds", "10",
                "--heartbeat-seconds", "1", "--", sys.executable, NOISY, str(out), "env", "9"]  # fmt: skip
        with host_out.open("wb") as stdout, (self.workdir / f"host-{n}.log").open("wb") as stderr:
            host = subprocess.Popen(argv, env=env, stdout=stdout, stderr=stderr)
        try:
            view = f"{self.url}/runs/{run_id}"
            _wait(
                lambda: _lines(out) > 5 and httpx.get(view, headers=sub).json()["status"] == "running",
                30,
                "the run running",
            )
            triggered = time.monotonic()
            httpx.post(
                f"{view}/quarantine",
                headers={"Authorization": "Bearer bench-op"},
                json={"reason": "bench", "evidence": {"trial": n}},
                timeout=30,
            ).raise_for_status()
            _wait(lambda: '"severed"' in self._stages(run_id), 20, "the stages reported")
        finally:
            host.send_signal(signal.SIGTERM)
            host.wait(30)
        summary = next(
            json.loads(line)["runnerHost"]
            for line in reversed(host_out.read_text().splitlines())
            if line.startswith('{"runnerHost"')
        )
        received = summary["frozenAtMonotonic"] - summary["toFrozenMs"] / 1000
        return (
            (received - triggered) * 1000,
            (summary["frozenAtMonotonic"] - triggered) * 1000,
            (summary["severedAtMonotonic"] - triggered) * 1000,
            summary["toFrozenMs"],
            summary["toSeveredMs"],
        )

    def _stages(self, run_id: str) -> str:
        answer = httpx.get(
            f"{self.url}/runs/{run_id}/quarantine",
            params={"afterVersion": 0, "waitMs": 0},
            headers={"Authorization": "Bearer bench-runner"},
        )
        stages = answer.json().get("stages") or {}
        return json.dumps({k: v for k, v in stages.items() if v})

    def stop(self) -> None:
        for service in reversed(self.services):
            stop_process(service.process.pid, 15.0, service.process)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.runner_host", description=__doc__)
    parser.add_argument("--trials", type=int, default=50, help="local trials per freezer mechanism")
    parser.add_argument("--e2e-trials", type=int, default=10, help="end-to-end trials (0 = none)")
    parser.add_argument("--e2e", action="store_true", help="run the e2e part even without the route file")
    parser.add_argument("--out", default="", help="also write the table (with its context) here")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("the runner host's containment needs root (cgroups, ip netns)")
    load = os.getloadavg()
    workdir = Path(tempfile.mkdtemp(prefix="tenure-bench-runner-host-"))
    rows = ["| path (trigger -> ...) | trials | p50 | p99 | max |", "|---|---:|---:|---:|---:|"]
    network = "?"
    try:
        for mechanism in (CGROUP_V2_FREEZE, CGROUP_V1_FREEZER, SIGSTOP):
            probe = Containment(f"p{uuid.uuid4().hex[:8]}", freezer=mechanism)
            if probe.freezer_mechanism != mechanism:
                say(f"{mechanism}: not available here; skipped")
                continue
            say(f"local, {mechanism}: {args.trials} trials")
            frozen, severed, network = measure_local(mechanism, args.trials, workdir)
            rows.append(_row(f"local: frozen ({mechanism})", frozen))
            rows.append(_row(f"local: severed ({network}, after the {mechanism} freeze)", severed))
        if args.e2e_trials and (args.e2e or ROUTES.exists()):
            broker: BrokerHandle | None = None
            system: E2E | None = None
            try:
                broker = start_broker(
                    port=None, data_dir=workdir / "kafka" / "data", state_dir=workdir / "kafka"
                )
                create_topics(broker.bootstrap_servers, TOPICS)
                system = E2E(workdir, broker.bootstrap_servers)
                say(f"e2e: {args.e2e_trials} trials")
                results = [system.trial(n) for n in range(args.e2e_trials)]
                rows.append(
                    _row("e2e from the operator's POST: host has the instruction", [r[0] for r in results])
                )
                rows.append(_row("e2e from the operator's POST: frozen", [r[1] for r in results]))
                rows.append(_row("e2e from the operator's POST: severed", [r[2] for r in results]))
                rows.append(_row("e2e, within the host: receipt -> frozen", [r[3] for r in results]))
                rows.append(_row("e2e, within the host: receipt -> severed", [r[4] for r in results]))
            finally:
                if system is not None:
                    system.stop()
                if broker is not None and broker.owned:
                    broker.stop()
        else:
            say("e2e: skipped (no services/command_api/routes_quarantine.py yet; --e2e to force)")
        table = "\n".join(rows)
        context = (
            f"`make bench-runner-host` (`python -m bench.runner_host --trials {args.trials} "
            f"--e2e-trials {args.e2e_trials}`), Python {sys.version.split()[0]}, `nproc` = {os.cpu_count()}, "
            f"kernel {os.uname().release}, 1-minute load {load[0]:.2f} at the start and "
            f"{os.getloadavg()[0]:.2f} at the end"
        )
        print(table)
        print(context)
        if args.out:
            Path(args.out).write_text(f"{table}\n\n{context}\n")
            say(f"wrote {args.out}")
        return 0
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
