"""Tool protection through the real gateway: the retry herd, fail-fast latency, breaker propagation.

Starts its own Kafka (or uses KAFKA_BOOTSTRAP_SERVERS), creates the topics, and runs the lease
coordinator, the breakers' processor, two effect gateways (A and B) and a tool endpoint that
notes when each call arrives (bench/breakers_endpoint.py) as subprocesses on temp state dirs.

1. Herd (BRK-3). 128 clients, each with its own run and lease, fail together against one
   endpoint ("herd", which answers 503): their first calls are held at the endpoint until all
   have arrived and then failed at the same instant. Each retries RETRIES times (a new
   idempotency key each time, as the saga does), waiting either the deterministic exponential
   T0 * 2^k or full jitter uniform(0, min(T_max, T0 * 2^k)) (T0 = 100 ms, T_max = 30 s, BRK-3;
   services/common/backoff.py). Three paths:
     direct      the clients call the endpoint themselves (no Tenure): the seed's setting;
     dispatched  through the gateways (half at A, half at B) with the herd's breaker disabled
                 by an operator, so every retry is recorded and dispatched: timed at the endpoint;
     open        through the gateways with the breaker forced open: every retry fails fast at
                 the gateway (nothing reaches the endpoint); timed as the clients send them.
   Printed per path and policy: the most retry arrivals in any 10 ms window (per second); for
   the last round (jitter window 3.2 s) its spread and arrivals / spread (the seed's measure:
   128 in 2 ms = 64,000/s against 128 over 2 s = 64/s), the ratios, and every round's figures.
2. Fail fast (BRK-2). The "flaky" endpoint's breaker is opened by ten 503s seen at A; then
   SAMPLES sequential POST /effects at A, each refused 424 ERR_CIRCUIT_OPEN: p50 / p99 as the
   client sees them (HTTP round trip on loopback, FastAPI and the body guard included).
3. Propagation (BRK-2). PROPAGATION times: an operator resets the breaker, A sees ten 503s,
   and the time from A's tenth answer until B's GET /breakers says it fails fast.

    .venv/bin/python -m bench.breakers_herd [--clients 128] [--retries 6] [--samples 2000]
                                            [--propagation 30] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from bench._saga_system import Lease, SagaDriver
from bench.foundation import Service, percentile, say, service_env, spawn
from services.breakers.client import BreakerClient
from services.common.backoff import full_jitter_s
from services.common.broker import BrokerHandle, free_port, start_broker, stop_process
from services.common.kafka import create_topics
from services.common.topics import TOPICS

T0_S = 0.1
T_MAX_S = 30.0
OPERATOR = "bench-operator"


def deterministic_s(attempt: int, rng: random.Random) -> float:
    """The forbidden one (BRK-3): every client waits the same T0 * 2^k."""
    return float(min(T_MAX_S, T0_S * 2**attempt))


def full_jitter(attempt: int, rng: random.Random) -> float:
    return full_jitter_s(attempt, T0_S, T_MAX_S, rng.random())


POLICIES: dict[str, Callable[[int, random.Random], float]] = {
    "deterministic exponential": deterministic_s,
    "full jitter": full_jitter,
}


class Fleet:
    def __init__(self, bootstrap: str, workdir: Path) -> None:
        self.workdir = workdir
        self.bootstrap = bootstrap
        endpoint_port = free_port()
        self.endpoint = f"http://127.0.0.1:{endpoint_port}"
        breakers_port = free_port()
        self.breakers_health = f"http://127.0.0.1:{breakers_port}/readyz"
        self.env = service_env(
            bootstrap,
            workdir / "state",
            TENURE_TOOLS=f"herd={self.endpoint},flaky={self.endpoint}",
            # Room for the whole herd at the endpoint: this measures backoff, not the bulkhead.
            TENURE_BULKHEAD_TOOLS="herd=external:256/256/60000,flaky=external:64/64/5000",
            # The herd's first calls are held at the endpoint until all of them are in.
            TENURE_TOOL_TIMEOUT_S="60",
            TENURE_DECISION_TIMEOUT_S="10",
            TENURE_COORDINATOR_HEALTH_PORT=str(free_port()),
            TENURE_BREAKERS_HEALTH_PORT=str(breakers_port),
            TENURE_LOG_LEVEL="WARNING",
        )
        self.urls = {name: f"http://127.0.0.1:{free_port()}" for name in ("A", "B")}
        self.services: list[Service] = []
        self.http = httpx.Client(timeout=30)

    def spawn_all(self) -> None:
        endpoint_port = self.endpoint.rsplit(":", 1)[1]
        self.services = [
            _spawn_with_args("endpoint", "bench.breakers_endpoint", [endpoint_port], self.workdir, self.env),
            spawn("lease_coordinator", "services.lease_coordinator", self.workdir / "coordinator", self.env),
            spawn("breakers", "services.breakers", self.workdir / "breakers", self.env),
        ]
        for name, url in self.urls.items():
            env = {
                **self.env,
                "TENURE_GATEWAY_PORT": url.rsplit(":", 1)[1],
                "TENURE_INSTANCE_ID": name.lower(),
            }
            self.services.append(
                spawn(f"gateway_{name}", "services.effect_gateway", self.workdir / name, env)
            )
        self.wait(f"{self.endpoint}/healthz")
        self.wait(self.breakers_health)
        for url in self.urls.values():
            self.wait(f"{url}/readyz", 120)

    def wait(self, url: str, timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for service in self.services:
                service.check_alive()
            try:
                if self.http.get(url, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"{url} did not answer 200 within {timeout_s:.0f}s")

    def stop(self) -> None:
        self.http.close()
        for service in reversed(self.services):
            stop_process(service.process.pid, 15.0, service.process)

    def mode(self, mode: str) -> None:
        self.http.post(f"{self.endpoint}/mode", params={"set": mode}).raise_for_status()

    def arrivals(self) -> list[tuple[float, str]]:
        body = self.http.get(f"{self.endpoint}/arrivals", params={"clear": "1"}).json()
        return [(float(t), str(k)) for t, k in body["arrivals"]]

    def verdict(self, name: str, tool: str) -> dict[str, Any]:
        found: dict[str, Any] = self.http.get(f"{self.urls[name]}/breakers").json()["endpoints"][tool]
        return found

    def until(
        self, check: Callable[[], bool], what: str, timeout_s: float = 30, poll_s: float = 0.01
    ) -> None:
        deadline = time.monotonic() + timeout_s
        while not check():
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out waiting for {what}")
            time.sleep(poll_s)


def _spawn_with_args(name: str, module: str, args: list[str], workdir: Path, env: dict[str, str]) -> Service:
    home = workdir / name
    home.mkdir(parents=True, exist_ok=True)
    log_file = home / f"{name}.log"
    with log_file.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            env=env,
            cwd=home,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    say(f"started {name} pid {process.pid} (log {log_file})")
    return Service(name, process, log_file)


def effect_body(lease: Lease, tool: str, key: str) -> dict[str, Any]:
    return {
        "runId": lease.run_id,
        "attemptId": lease.attempt_id,
        "epoch": lease.epoch,
        "idempotencyKey": key,
        "tool": tool,
        "operation": "call",
        "payload": {},
    }


def peak_rate(times: list[float], window_s: float) -> float:
    """Most arrivals in any window of `window_s`, per second."""
    ordered, best, start = sorted(times), 0, 0
    for end, t in enumerate(ordered):
        while t - ordered[start] > window_s:
            start += 1
        best = max(best, end - start + 1)
    return best / window_s


# --- 1. the herd -------------------------------------------------------------------------------


def _round_stats(times: list[float]) -> tuple[float, float, float]:
    """One retry round's arrivals: (spread in ms, mean rate over the spread = arrivals / spread,
    the seed's measure, and the peak rate in a 10 ms window), rates per second."""
    if not times:
        return 0.0, 0.0, 0.0
    spread = max(max(times) - min(times), 0.001)  # a 1 ms floor: the clock and the stack's grain
    return spread * 1000, len(times) / spread, peak_rate(times, 0.010)


# Where the herd goes, and where its arrivals are timed (see the module's docstring).
PATHS = {
    "direct": "straight to the endpoint (no Tenure), timed at the endpoint",
    "dispatched": "through the gateways, breaker disabled, timed at the endpoint",
    "open": "through the gateways, breaker open, timed at the gateways",
}


def herd(fleet: Fleet, leases: list[Lease], retries: int, policy: str, path: str, tag: str) -> dict[str, Any]:
    """Every client fails together (the first calls are held at the endpoint until all are in,
    then failed at once; against an open breaker they fail fast at once anyway), then retries
    `retries` times with the policy's waits; every retry fails at once."""
    wait_for = POLICIES[policy]
    sent: list[tuple[float, int]] = []
    expected = {"direct": (503,), "dispatched": (502, 504), "open": (424,)}[path]

    async def call(i: int, attempt: int, http: aiohttp.ClientSession) -> int:
        key = f"{tag}/{i}/{attempt}"
        if path == "direct":
            headers = {"Idempotency-Key": key, "X-Fencing-Epoch": "1", "X-Work-Id": leases[i].run_id}
            request = http.post(f"{fleet.endpoint}/effects", headers=headers, json={"operation": "call"})
        else:
            url = fleet.urls["AB"[i % 2]]
            request = http.post(f"{url}/effects", json=effect_body(leases[i], "herd", key))
        async with request as answer:
            text = await answer.text()
            if answer.status not in expected:
                raise RuntimeError(f"{path} {key}: got {answer.status} {text[:300]}")
            return answer.status

    async def client(i: int, http: aiohttp.ClientSession, go: asyncio.Event) -> None:
        rng = random.Random(f"{tag}-{i}")
        await go.wait()
        for attempt in range(retries + 1):
            sent.append((time.monotonic(), attempt))
            await call(i, attempt, http)
            if attempt < retries:
                await asyncio.sleep(wait_for(attempt, rng))

    async def release_when_all_held(http: aiohttp.ClientSession) -> None:
        while True:
            async with http.get(f"{fleet.endpoint}/arrivals") as answer:
                body = await answer.json()
            held = [k for _, k in body["arrivals"] if k.startswith(f"{tag}/") and k.endswith("/0")]
            if len(held) == len(leases):
                break
            await asyncio.sleep(0.01)
        async with http.post(f"{fleet.endpoint}/mode", params={"set": "fail"}):
            pass
        async with http.post(f"{fleet.endpoint}/release"):
            pass

    async def run() -> float:
        # aiohttp: ~10x less client CPU per request than httpx (bench/_steps_workload.py), so the
        # clients are not what spreads the herd out.
        connector = aiohttp.TCPConnector(limit=len(leases) * 2)
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
            go = asyncio.Event()
            tasks = [asyncio.create_task(client(i, http, go)) for i in range(len(leases))]
            await asyncio.sleep(0.2)
            began = time.monotonic()
            go.set()
            if path != "open":
                await release_when_all_held(http)
            await asyncio.gather(*tasks)
            return time.monotonic() - began

    fleet.arrivals()
    fleet.mode("fail" if path == "open" else "hold")
    took = asyncio.run(run())
    at_endpoint = [(t, int(k.rsplit("/", 1)[1])) for t, k in fleet.arrivals() if k.startswith(f"{tag}/")]
    timed = sent if path == "open" else at_endpoint
    rounds = {k: _round_stats([t for t, attempt in timed if attempt == k]) for k in range(1, retries + 1)}
    retried = [t for t, attempt in timed if attempt >= 1]
    return {
        "policy": policy,
        "path": path,
        "reached": len(at_endpoint),
        "took_s": took,
        "peak_10ms": peak_rate(retried, 0.010),
        "rounds": rounds,
    }


# --- 2. and 3. the breaker ---------------------------------------------------------------------


def open_at_a(fleet: Fleet, lease: Lease, tag: str) -> float:
    for i in range(10):
        answer = fleet.http.post(f"{fleet.urls['A']}/effects", json=effect_body(lease, "flaky", f"{tag}/{i}"))
        if answer.status_code != 502:
            raise RuntimeError(f"opening the breaker: {answer.status_code} {answer.text}")
    return time.monotonic()


def fail_fast(fleet: Fleet, lease: Lease, samples: int, tag: str) -> list[float]:
    fleet.mode("fail")
    open_at_a(fleet, lease, f"{tag}-open")
    fleet.until(lambda: fleet.verdict("A", "flaky")["failFast"], "A to fail fast")
    took = []
    fleet.arrivals()  # forget the openers
    for i in range(samples):
        began = time.perf_counter()
        answer = fleet.http.post(
            f"{fleet.urls['A']}/effects", json=effect_body(lease, "flaky", f"{tag}/ff-{i}")
        )
        took.append(time.perf_counter() - began)
        if answer.status_code != 424 or answer.json().get("code") != "ERR_CIRCUIT_OPEN":
            raise RuntimeError(f"expected ERR_CIRCUIT_OPEN, got {answer.status_code} {answer.text}")
    if fleet.arrivals():
        raise RuntimeError("a refused call reached the endpoint")
    return took


def propagation(fleet: Fleet, lease: Lease, operator: BreakerClient, samples: int, tag: str) -> list[float]:
    fleet.mode("fail")
    delays = []
    for n in range(samples):
        asyncio.run(operator.reset("flaky", f"bench sample {n}", OPERATOR))
        fleet.until(
            lambda: all(fleet.verdict(name, "flaky")["status"] == "closed" for name in fleet.urls), "reset"
        )
        last = open_at_a(fleet, lease, f"{tag}-{n}")
        fleet.until(lambda: fleet.verdict("B", "flaky")["failFast"], "B to fail fast", poll_s=0.001)
        delays.append(time.monotonic() - last)
    return delays


# --- the report --------------------------------------------------------------------------------


def render(herds: list[dict[str, Any]], fast: list[float], spread: list[float], clients: int) -> str:
    last = len(herds[0]["rounds"])
    ceiling_s = min(T_MAX_S, T0_S * 2 ** (last - 1))
    rows = [
        f"| The herd ({clients} clients fail together) | Retry policy | Retries' peak, 10 ms window "
        f"| Round {last} (wait up to {ceiling_s:g} s): spread, arrivals / spread "
        "| Calls reaching the endpoint | Took |",
        "|---|---|---|---|---|---|",
    ]
    by_path: dict[str, dict[str, dict[str, Any]]] = {}
    for h in herds:
        by_path.setdefault(h["path"], {})[h["policy"]] = h
    for path, pair in by_path.items():
        for h in pair.values():
            width, mean, _ = h["rounds"][last]
            rows.append(
                f"| {PATHS[path]} | {h['policy']} | {h['peak_10ms']:,.0f} req/s "
                f"| {width:,.0f} ms, {mean:,.0f} req/s | {h['reached']} | {h['took_s']:.1f} s |"
            )
        det, jit = pair["deterministic exponential"], pair["full jitter"]
        peak = det["peak_10ms"] / max(jit["peak_10ms"], 1e-9)
        mean = det["rounds"][last][1] / max(jit["rounds"][last][1], 1e-9)
        rows.append(f"| | **ratio** | **{peak:.1f}x** | **{mean:.0f}x** | | |")
    header = " | ".join(f"{path}: deterministic | {path}: full jitter" for path in by_path)
    rows += [
        "",
        "Each round: spread of its arrivals; arrivals / spread; peak in a 10 ms window.",
        "",
        f"| Retry round k (wait up to T0 * 2^(k-1)) | {header} |",
        "|---" * (1 + 2 * len(by_path)) + "|",
    ]
    for k in range(1, last + 1):
        cells = []
        for pair in by_path.values():
            for policy in POLICIES:
                width, mean, peak10 = pair[policy]["rounds"][k]
                cells.append(f"{width:,.0f} ms; {mean:,.0f}/s; {peak10:,.0f}/s")
        ceiling = min(T_MAX_S, T0_S * 2 ** (k - 1)) * 1000
        rows.append(f"| {k} ({ceiling:,.0f} ms) | " + " | ".join(cells) + " |")
    ms = [t * 1000 for t in fast]
    prop = [t * 1000 for t in spread]
    rows += [
        "",
        "| Breaker | p50 | p99 | max | samples |",
        "|---|---|---|---|---|",
        f"| fail fast when open (HTTP round trip at A) | {percentile(ms, 50):.2f} ms "
        f"| {percentile(ms, 99):.2f} ms | {max(ms):.2f} ms | {len(ms)} |",
        f"| propagation A -> B (A's 10th failure answered -> B fails fast) | {percentile(prop, 50):.1f} ms "
        f"| {percentile(prop, 99):.1f} ms | {max(prop):.1f} ms | {len(prop)} |",
    ]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.breakers_herd", description=__doc__)
    parser.add_argument("--clients", type=int, default=128)
    parser.add_argument("--retries", type=int, default=6)
    parser.add_argument("--samples", type=int, default=2000, help="fail-fast calls")
    parser.add_argument("--propagation", type=int, default=30, help="breaker openings timed at B")
    parser.add_argument("--out", default="", help="also write the tables (with their context) here")
    parser.add_argument("--keep-temp", action="store_true")
    args = parser.parse_args(argv)
    load, tag = os.getloadavg(), uuid.uuid4().hex[:8]
    workdir = Path(tempfile.mkdtemp(prefix="tenure-bench-breakers-"))
    broker: BrokerHandle | None = None
    fleet: Fleet | None = None
    driver: SagaDriver | None = None
    operator: BreakerClient | None = None
    ok = False
    try:
        external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
        if external:
            bootstrap = external
        else:
            broker = start_broker(port=None, data_dir=workdir / "kafka" / "data", state_dir=workdir / "kafka")
            bootstrap = broker.bootstrap_servers
        create_topics(bootstrap, TOPICS)
        fleet = Fleet(bootstrap, workdir)
        fleet.spawn_all()
        driver = SagaDriver(bootstrap, name=f"bench-breakers-{tag}")
        say(f"claiming {args.clients + 1} runs")
        leases = [driver.claim_new_run(f"herd-{tag}-{i}", 60) for i in range(args.clients)]
        flaky = driver.claim_new_run(f"flaky-{tag}", 60)
        operator = BreakerClient.connect(bootstrap, f"bench-{tag}", actor=OPERATOR)
        herds = []
        for path in PATHS:
            if path == "dispatched":  # every retry reaches the endpoint: the backoff alone is compared
                asyncio.run(operator.disable("herd", "bench: compare the retry policies alone", OPERATOR))
                fleet.until(
                    lambda: all(fleet.verdict(n, "herd")["status"] == "disabled" for n in fleet.urls), "off"
                )
            if path == "open":
                asyncio.run(operator.force_open("herd", "bench: the herd against an open breaker", OPERATOR))
                fleet.until(
                    lambda: all(fleet.verdict(n, "herd")["failFast"] for n in fleet.urls), "forced open"
                )
            for policy in POLICIES:
                say(f"herd: {args.clients} clients, {policy}, {PATHS[path]}")
                herds.append(
                    herd(fleet, leases, args.retries, policy, path, f"{tag}-{path}-{policy.split()[0]}")
                )
                say(f"  {herds[-1]}")
        asyncio.run(operator.reset("flaky", "bench: start closed", OPERATOR))  # a reused broker
        say(f"fail fast: {args.samples} calls")
        fast = fail_fast(fleet, flaky, args.samples, f"{tag}-ff")
        say(f"propagation: {args.propagation} openings")
        spread = propagation(fleet, flaky, operator, args.propagation, f"{tag}-prop")
        for service in fleet.services:
            service.check_alive()
        table = render(herds, fast, spread, args.clients)
        print(table)
        context = (
            f"`python -m bench.breakers_herd --clients {args.clients} --retries {args.retries} --samples "
            f"{args.samples} --propagation {args.propagation}`, T0 = {T0_S * 1000:.0f} ms, "
            f"T_max = {T_MAX_S:.0f} s, two gateways, Python {sys.version.split()[0]}, "
            f"`nproc` = {os.cpu_count()}, 1-minute load {load[0]:.2f} at the start and "
            f"{os.getloadavg()[0]:.2f} at the end"
        )
        print(context)
        if args.out:
            Path(args.out).write_text(f"{table}\n\n{context}\n")
            say(f"wrote {args.out}")
        ok = True
        return 0
    finally:
        if operator is not None:
            operator.close()
        if driver is not None:
            driver.close()
        if fleet is not None:
            fleet.stop()
        if broker is not None and broker.owned:
            say(f"stopped broker: {broker.stop()}")
        if ok and not args.keep_temp:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            say(f"temp dir kept: {workdir}")


if __name__ == "__main__":
    raise SystemExit(main())
