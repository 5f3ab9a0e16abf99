"""Observation -> intervention visible to the runner, through the real system (issue 12, WD-5).

Starts its own Kafka (or uses KAFKA_BOOTSTRAP_SERVERS), creates the topics and runs the lease
coordinator, projector, command API, saga orchestrator and semantic watchdog as subprocesses on
temp state dirs. Then, per sample, a fresh run: submit, claim, open its trajectory, report two
steps of a 2-state loop (states A, B) through POST /runs/{id}/observations, and time the third
(back to A: a period-2 cycle, level 1) from just before its POST until the runner sees the
intervention on each of the three paths it reaches the runner by, watched at once:

* view:       GET /runs/{id}/watchdog?afterVersion=... (the long-poll a runner or SDK waits on;
              the watchdog's transaction, then the projector's fold);
* heartbeat:  the first heartbeat answer (POST /attempts/{id}/heartbeat, sent back to back)
              whose `watchdog` carries it;
* refusal:    the trajectory view showing the interrupt (GET /runs/{id}/trajectory long-poll):
              from then on the orchestrator refuses the looping action (the intervention went
              watchdog -> trajectories.commands -> saga orchestrator -> projector).

Prints p50 / p99 / max per path (nearest rank). `--out FILE` writes the table with its context.

    .venv/bin/python -m bench.watchdog_latency [--samples 100] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx

from bench.foundation import Service, percentile, say, service_env, spawn, wait_for_api
from services.common.broker import BrokerHandle, free_port, start_broker, stop_process
from services.common.kafka import create_topics
from services.common.topics import TOPICS

PATHS = ("view", "heartbeat", "refusal")
STATE = {"a": "a" * 64, "b": "b" * 64}
_WAIT_S = 20.0


def _started(workdir: Path, bootstrap: str) -> tuple[list[Service], str]:
    state = workdir / "state"
    api_port = free_port()
    base = {
        "TENURE_COORDINATOR_HEALTH_PORT": str(free_port()),
        "TENURE_PROJECTIONS_HEALTH_PORT": str(free_port()),
        "TENURE_SAGA_HEALTH_PORT": str(free_port()),
        "TENURE_WATCHDOG_HEALTH_PORT": str(free_port()),
        # The saga opens trajectories only; nothing is dispatched, so no gateway is needed.
        "TENURE_GATEWAY_URL": f"http://127.0.0.1:{free_port()}",
    }
    env = service_env(bootstrap, state, TENURE_API_PORT=str(api_port), **base)
    services = [
        spawn("lease_coordinator", "services.lease_coordinator", workdir / "coordinator", env),
        spawn("projections", "services.projections", workdir / "projections", env),
    ]
    views = state / "projections" / "run_views" / "CURRENT"
    deadline = time.monotonic() + 60
    while not views.exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the projector's store did not appear")
        services[-1].check_alive()
        time.sleep(0.1)
    services.append(spawn("command_api", "services.command_api", workdir / "api", env))
    services.append(spawn("saga_orchestrator", "services.saga_orchestrator", workdir / "saga", env))
    services.append(spawn("watchdog", "services.watchdog", workdir / "watchdog", env))
    url = f"http://127.0.0.1:{api_port}"
    wait_for_api(url, services[2])
    for name, port in (
        ("saga_orchestrator", base["TENURE_SAGA_HEALTH_PORT"]),
        ("watchdog", base["TENURE_WATCHDOG_HEALTH_PORT"]),
    ):
        _wait_ready(f"http://127.0.0.1:{port}/readyz", next(s for s in services if s.name == name))
    return services, url


def _wait_ready(url: str, service: Service, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        service.check_alive()
        try:
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{service.name} was not ready after {timeout_s:.0f}s")


class Sample:
    """One looping run, set up to the brink of its first detection."""

    def __init__(self, http: httpx.Client, tag: str, n: int) -> None:
        self.http = http
        created = http.post(
            "/runs",
            headers={"Idempotency-Key": f"wd-latency-{tag}-{n}"},
            json={"tenant": "bench-watchdog", "executionSpec": {"n": n}, "timeoutSeconds": 900},
        )
        created.raise_for_status()
        self.run_id = created.json()["runId"]
        grant = http.post(f"/runs/{self.run_id}/attempts", json={"runnerId": "bench", "leaseSeconds": 300})
        grant.raise_for_status()
        self.attempt = grant.json()["attemptId"]
        self.lease = {"attemptId": self.attempt, "leaseEpoch": grant.json()["epoch"]}
        http.post(f"/runs/{self.run_id}/trajectory", json=self.lease).raise_for_status()
        self.step = 0
        self.sequence = 0
        for name in ("a", "b"):
            self.observe(name)

    def observe(self, name: str) -> None:
        self.step += 1
        body = {
            **self.lease,
            "stepSeq": self.step,
            "tool": "vm.provision",
            "arguments": {"name": name},
            "stateHash": STATE[name],
        }
        self.http.post(f"/runs/{self.run_id}/observations", json=body).raise_for_status()

    def version(self, what: str) -> int:
        """The view's version once it shows the two steps before the loop closes."""
        path = "watchdog" if what == "view" else "trajectory"
        deadline = time.monotonic() + _WAIT_S
        while True:
            view = self.http.get(f"/runs/{self.run_id}/{path}")
            if view.status_code == 200 and (what != "view" or view.json()["turn"] >= self.step):
                return int(view.json()["version"])
            if time.monotonic() > deadline:
                raise TimeoutError(f"the {path} view of {self.run_id} did not show step {self.step}")
            time.sleep(0.005)


def _watch_view(client: httpx.Client, run_id: str, after: int, stop: float) -> bool:
    while time.monotonic() < stop:
        body = client.get(f"/runs/{run_id}/watchdog", params={"afterVersion": after, "waitMs": 5000}).json()
        if body.get("interventions"):
            return True
        after = int(body.get("version", after))
    return False


def _watch_trajectory(client: httpx.Client, run_id: str, after: int, stop: float) -> bool:
    while time.monotonic() < stop:
        body = client.get(f"/runs/{run_id}/trajectory", params={"afterVersion": after, "waitMs": 5000}).json()
        if (body.get("watchdog") or {}).get("interruptAction"):
            return True
        after = int(body.get("version", after))
    return False


def _watch_heartbeats(client: httpx.Client, sample: Sample, stop: float) -> bool:
    while time.monotonic() < stop:
        sample.sequence += 1
        beat = client.post(
            f"/attempts/{sample.attempt}/heartbeat",
            json={"leaseEpoch": sample.lease["leaseEpoch"], "sequence": sample.sequence},
        ).json()
        if beat.get("watchdog"):
            return True
    return False


def one_sample(clients: dict[str, httpx.Client], sample: Sample) -> dict[str, float]:
    """Milliseconds from the looping observation's POST until each path shows its intervention."""
    after = {"view": sample.version("view"), "refusal": sample.version("refusal")}
    watchers: dict[str, Callable[[float], bool]] = {
        "view": lambda stop: _watch_view(clients["view"], sample.run_id, after["view"], stop),
        "heartbeat": lambda stop: _watch_heartbeats(clients["heartbeat"], sample, stop),
        "refusal": lambda stop: _watch_trajectory(clients["refusal"], sample.run_id, after["refusal"], stop),
    }
    go = threading.Event()
    seen: dict[str, float] = {}

    def watcher(path: str) -> None:
        go.wait()
        if watchers[path](time.monotonic() + _WAIT_S):
            seen[path] = time.monotonic()

    threads = [threading.Thread(target=watcher, args=(path,), daemon=True) for path in PATHS]
    for thread in threads:
        thread.start()
    started = time.monotonic()
    go.set()
    sample.observe("a")  # back to state A: period 2
    for thread in threads:
        thread.join(_WAIT_S + 10)
    missing = [path for path in PATHS if path not in seen]
    if missing:
        raise RuntimeError(f"{sample.run_id}: the intervention never showed on {missing}")
    return {path: (seen[path] - started) * 1000 for path in PATHS}


def measure(url: str, samples: int, tag: str) -> dict[str, list[float]]:
    timings: dict[str, list[float]] = {path: [] for path in PATHS}
    clients = {name: httpx.Client(base_url=url, timeout=30) for name in ("setup", *PATHS)}
    try:
        for n in range(samples):
            for path, ms in one_sample(clients, Sample(clients["setup"], tag, n)).items():
                timings[path].append(ms)
            if (n + 1) % 20 == 0:
                say(f"{n + 1}/{samples} samples")
    finally:
        for client in clients.values():
            client.close()
    return timings


def render(timings: dict[str, list[float]]) -> str:
    what = {
        "view": "GET /runs/{id}/watchdog long-poll shows the intervention",
        "heartbeat": "the next heartbeat answer carries `watchdog`",
        "refusal": "the trajectory shows the interrupt (the orchestrator refuses the action)",
    }
    lines = [
        "| observation -> visible to the runner | samples | p50 ms | p99 ms | max ms |",
        "|---|---:|---:|---:|---:|",
    ]
    for path in PATHS:
        values = timings[path]
        lines.append(
            f"| {what[path]} | {len(values)} | {percentile(values, 50):.1f} | "
            f"{percentile(values, 99):.1f} | {max(values):.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.watchdog_latency", description=__doc__)
    parser.add_argument("--samples", type=int, default=100, help="looping runs, one detection each")
    parser.add_argument("--out", default="", help="also write the table (with its context) here")
    parser.add_argument("--keep-temp", action="store_true")
    args = parser.parse_args(argv)
    load, tag = os.getloadavg(), uuid.uuid4().hex[:8]
    workdir = Path(tempfile.mkdtemp(prefix="tenure-bench-watchdog-"))
    broker: BrokerHandle | None = None
    services: list[Service] = []
    ok = False
    try:
        broker = start_broker(port=None, data_dir=workdir / "kafka" / "data", state_dir=workdir / "kafka")
        create_topics(broker.bootstrap_servers, TOPICS)
        services, url = _started(workdir, broker.bootstrap_servers)
        say(f"warming up, then {args.samples} samples")
        measure(url, 3, f"warm-{tag}")
        table = render(measure(url, args.samples, tag))
        for service in services:
            service.check_alive()
        print(table)
        context = (
            f"{args.samples} samples, `python -m bench.watchdog_latency --samples {args.samples}`, "
            f"Python {sys.version.split()[0]}, `nproc` = {os.cpu_count()}, 1-minute load {load[0]:.2f} "
            f"at the start and {os.getloadavg()[0]:.2f} at the end"
        )
        print(context)
        if args.out:
            Path(args.out).write_text(f"{table}\n\n{context}\n")
            say(f"wrote {args.out}")
        ok = True
        return 0
    finally:
        for service in reversed(services):
            stop_process(service.process.pid, 15.0, service.process)
        if broker is not None and broker.owned:
            say(f"stopped broker: {broker.stop()}")
        if ok and not args.keep_temp:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            say(f"temp dir kept: {workdir}")


if __name__ == "__main__":
    sys.exit(main())
