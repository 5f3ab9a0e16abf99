"""An operator overrides a circuit breaker on real processes (issue 13 part 3, BRK-1, BRK-2).

`python -m services.breakers` and `python -m services.command_api` on the real broker, with API
keys set. A gateway stand-in (a BreakerClient, as the effect gateway reports calls) creates the
endpoint's breaker. A submitter's force-open is 403 and nothing reaches breakers.commands; the
operator's force-open, with a reason, is decided by the breaker processor, shown by
GET /breakers/{endpoint} with the reason and the operator, and by `tenure tail` (its default
topics) as a line of its own; `tenure breakers get` shows it through the API; the reset closes it.
breakers.commands and breakers.events are read directly, so "nothing recorded" is not the API's
own word.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.breakers.client import BreakerClient
from services.common.contracts import SUCCESS, BreakerForcedOpen, BreakerReset, ForceOpenBreaker
from services.common.routing import partition_for_endpoint
from services.common.topics import BREAKERS_COMMANDS, BREAKERS_EVENTS
from tests.support.system import (
    ServiceProcess,
    decode_all,
    free_port,
    read_topic,
    service_env,
    stop_all,
    wait_for_http,
    wait_for_ready,
    wait_until,
)
from tests.support.tenure import problem_type

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

KEYS = "olga-key=olga:operator,rita-key=rita:submitter"
OLGA = {"Authorization": "Bearer olga-key"}
RITA = {"Authorization": "Bearer rita-key"}


class System:
    def __init__(self, bootstrap: str, tmp: Path) -> None:
        self.bootstrap = bootstrap
        self.port, self.health_port = free_port(), free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.env = service_env(
            bootstrap,
            tmp / "state",
            TENURE_API_PORT=str(self.port),
            TENURE_API_KEYS=KEYS,
            TENURE_DECISION_TIMEOUT_S="10",
            TENURE_BREAKERS_HEALTH_PORT=str(self.health_port),
            TENURE_CLI_API_URL=self.base,
        )
        self.breakers = ServiceProcess("breakers", "services.breakers", self.env, tmp)
        self.api = ServiceProcess("command-api", "services.command_api", self.env, tmp)

    def start(self) -> System:
        self.breakers.start()
        self.api.start()
        wait_for_ready(self.health_port, 90, self.breakers)
        wait_for_http(f"{self.base}/healthz", 60)
        return self

    def stop(self) -> None:
        stop_all((self.api, self.breakers))

    def cli(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "services.tenure_cli", *args],
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=90,
        )


@pytest.fixture(scope="module")
def system(tenure_topics: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    s = System(tenure_topics, tmp_path_factory.mktemp("breaker-operators")).start()
    try:
        yield s
    finally:
        s.stop()


def _of(bootstrap: str, topic: Any, endpoint: str) -> list[Any]:
    partition = partition_for_endpoint(endpoint, topic.partitions)
    records = [r for r in read_topic(bootstrap, topic.name, topic.partitions) if r.partition == partition]
    return [m for m in decode_all(records) if getattr(m, "run_id", None) == endpoint]


def _force_opens(system: System, endpoint: str) -> list[ForceOpenBreaker]:
    return [c for c in _of(system.bootstrap, BREAKERS_COMMANDS, endpoint) if isinstance(c, ForceOpenBreaker)]


def test_an_operator_forces_a_breaker_open_with_a_reason_and_resets_it_brk_1_brk_2(system: System) -> None:
    endpoint = f"e2e-{time.time_ns()}/charge"
    gateway = BreakerClient.connect(system.bootstrap, "gw-e2e")
    http = httpx.Client(base_url=system.base, timeout=30)
    try:
        # A call the gateway reports creates the endpoint's breaker (BRK-1), closed.
        future = gateway.record_outcome(endpoint, SUCCESS, 12)
        assert future is not None
        future.result(30)

        def shown() -> dict[str, Any] | None:
            answer = http.get(f"/breakers/{endpoint}", headers=RITA)
            return answer.json() if answer.status_code == 200 else None

        breaker = wait_until(shown, 60, f"GET /breakers/{endpoint} to show the breaker", poll_s=0.2)
        assert breaker["status"] == "closed" and breaker["window"]["calls"] == 1

        # A submitter may read, not override: 403, and nothing reaches the breaker.
        refused = http.post(
            f"/breakers/{endpoint}/force-open", headers=RITA, json={"reason": "I think it is down"}
        )
        assert refused.status_code == 403 and problem_type(refused) == "forbidden"
        assert not _force_opens(system, endpoint)

        reason = "payment provider maintenance until 14:00 UTC"
        forced = http.post(
            f"/breakers/{endpoint}/force-open",
            headers={**OLGA, "Idempotency-Key": f"maint-{endpoint}"},
            json={"reason": reason},
        )
        assert forced.status_code == 200, forced.text
        assert forced.json()["status"] == "forced-open" and forced.json()["failsFast"] is True
        view = http.get(f"/breakers/{endpoint}", headers=RITA).json()
        assert view["status"] == "forced-open" and view["reason"] == reason
        last = view["transitions"][-1]
        assert (last["type"], last["by"], last["reason"], last["previousStatus"]) == (
            "BreakerForcedOpen",
            "olga",
            reason,
            "closed",
        )
        # The breaker processor recorded it, once, with the reason and the operator (and the
        # submitter's attempt never became a command).
        events = _of(system.bootstrap, BREAKERS_EVENTS, endpoint)
        (recorded,) = [e for e in events if isinstance(e, BreakerForcedOpen)]
        assert (recorded.reason, recorded.actor) == (reason, "olga")
        assert [c.actor for c in _force_opens(system, endpoint)] == ["olga"]

        # `tenure tail` (its default topics) shows the override as a line of its own.
        tail = system.cli("tail", "--from-beginning", "--run", endpoint, "--idle-exit", "3")
        assert tail.returncode == 0, tail.stderr
        assert f"FORCED OPEN by olga (was closed): {reason}" in tail.stdout, tail.stdout
        assert "success from gw-e2e in 12 ms" in tail.stdout, tail.stdout

        # The CLI reads it through the API (TENURE_CLI_API_URL), with a key of its own.
        got = system.cli("breakers", "get", endpoint, TENURE_CLI_API_KEY="rita-key")
        assert got.returncode == 0, got.stderr
        assert "Status:       forced-open (calls fail fast)" in got.stdout
        assert f"Reason:       {reason}" in got.stdout

        # The reset closes it, and says why.
        reset = system.cli(
            "breakers",
            "reset",
            endpoint,
            "--reason",
            "provider is back",
            "-o",
            "json",
            TENURE_CLI_API_KEY="olga-key",
        )
        assert reset.returncode == 0, reset.stderr
        closed = http.get(f"/breakers/{endpoint}", headers=RITA).json()
        assert closed["status"] == "closed" and closed["failsFast"] is False
        assert [t["type"] for t in closed["transitions"]] == ["BreakerForcedOpen", "BreakerReset"]
        resets = [e for e in _of(system.bootstrap, BREAKERS_EVENTS, endpoint) if isinstance(e, BreakerReset)]
        assert [(e.reason, e.actor, e.previous_status) for e in resets] == [
            ("provider is back", "olga", "forced-open")
        ]
    finally:
        http.close()
        gateway.close()
