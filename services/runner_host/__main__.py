"""`python -m services.runner_host --run-id RUN [options] -- COMMAND...`: the managed runner host.

Claims RUN through the runner SDK, runs COMMAND as its contained child and carries out Tenure's
instructions (quarantine, cancel) until the child ends; see host.py. Settings (TenureSettings):
TENURE_RUNNER_HOST_ID (unique per live host; its stale cgroups and namespaces are removed at
start-up), TENURE_RUNNER_HOST_API_URL / _API_KEY (the runner's own key), _STOP_GRACE_S, _FREEZER,
_NETWORK, _HEALTH_PORT (default 8308: /healthz, /readyz, /metrics), TENURE_GATEWAY_URL.
Prints one JSON line `{"runnerHost": {...}}` with the result (outcome, mechanisms, containment
times) before it exits: 0 when the outcome was reported (or the run stayed quarantined), else 1.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from prometheus_client import Histogram

from services.common.health import Check, metrics_registry, serve_health
from services.common.logs import configure_logging, log_fields
from services.common.settings import TenureSettings, child_environment
from services.runner_host.child import Containment, ContainmentTimes
from services.runner_host.control import QuarantineChannel
from services.runner_host.host import HostConfig, HostResult, RunnerHost
from services.runner_sdk.client import TenureClient

__all__ = ["build_parser", "main", "summary"]

log = logging.getLogger("tenure.runner_host")
_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m services.runner_host", description=__doc__)
    parser.add_argument("--run-id", required=True, help="the run to claim and execute")
    parser.add_argument("--capability", action="append", default=[], help="a runner capability (repeatable)")
    parser.add_argument("--lease-seconds", type=int, default=None)
    parser.add_argument("--heartbeat-seconds", type=int, default=None)
    parser.add_argument("--workdir", type=Path, default=None, help="the child's working directory")
    parser.add_argument("--child-log", type=Path, default=None, help="append the child's output here")
    parser.add_argument(
        "--claim-wait",
        type=float,
        default=0.0,
        help="seconds to keep asking while the run is not submitted yet or the API not up (default 0)",
    )
    parser.add_argument("command", nargs="+", help="the agent command (after --)")
    return parser


def summary(result: HostResult, containment: Containment) -> dict[str, object]:
    times: ContainmentTimes | None = result.containment
    return {
        "outcome": result.outcome,
        "exitCode": result.exit_code,
        "forced": result.forced,
        "reported": result.reported,
        "freezer": containment.freezer_mechanism,
        "network": containment.network_mechanism,
        "toFrozenMs": None if times is None else round(times.to_frozen_s * 1000, 3),
        "toSeveredMs": None if times is None else round(times.to_severed_s * 1000, 3),
        "frozenAtMonotonic": None if times is None else times.frozen_at,
        "severedAtMonotonic": None if times is None else times.severed_at,
        "containmentError": None if times is None else times.error,
        "stages": [
            {"stage": s.stage, "mechanism": s.mechanism, "accepted": s.accepted} for s in result.stages
        ],
        "detail": result.detail,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings = TenureSettings()
    configure_logging(settings.log_level, "runner-host")
    api_url = settings.runner_host_api_url or f"http://{settings.api_host}:{settings.api_port}"
    key = settings.runner_host_api_key or None
    containment = Containment(
        settings.runner_host_id, freezer=settings.runner_host_freezer, network=settings.runner_host_network
    )
    containment.remove_stale()  # a SIGKILLed predecessor with this host id
    log.info(
        "runner host %s: freezer %s, network %s",
        settings.runner_host_id,
        containment.freezer_mechanism,
        containment.network_mechanism,
    )
    registry = metrics_registry()
    histogram = Histogram(
        "tenure_runner_host_containment_seconds",
        "From the quarantine instruction's receipt to the stage's completion, by stage.",
        ["stage"],
        registry=registry,
        buckets=_BUCKETS,
    )

    def observe(times: ContainmentTimes) -> None:
        histogram.labels("suspended").observe(times.to_frozen_s)
        histogram.labels("severed").observe(times.to_severed_s)

    client = TenureClient(api_url, settings.gateway_url, key)
    channel = QuarantineChannel(api_url, key, settings.runner_host_id)
    config = HostConfig(
        run_id=args.run_id,
        host_id=settings.runner_host_id,
        command=tuple(args.command),
        api_url=api_url,
        gateway_url=settings.gateway_url,
        capabilities=tuple(args.capability),
        lease_seconds=args.lease_seconds,
        heartbeat_seconds=args.heartbeat_seconds,
        stop_grace_s=settings.runner_host_stop_grace_s,
        workdir=args.workdir,
        child_log=args.child_log,
        claim_wait_s=args.claim_wait,
        base_env=child_environment(),
    )
    host = RunnerHost(config, containment, client, channel, on_contained=observe)

    def readiness() -> list[Check]:
        state = host.status()
        lease = state["lease"]
        return [
            Check("lease", lease in ("valid", "jeopardy"), f"lease {lease}"),
            Check("child", bool(state["childRunning"]), f"pid {state['childPid']}"),
            Check("containment", True, f"freezer {state['freezer']}, network {state['network']}"),
        ]

    server = serve_health(
        "runner-host", settings.runner_host_health_port, readiness, registry, settings.api_host
    )
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: host.request_shutdown())
    try:
        result = host.run()
    except Exception as exc:
        log.exception("runner host for run %s failed", args.run_id, extra=log_fields(run_id=args.run_id))
        print(json.dumps({"runnerHost": {"outcome": "not-claimed", "detail": str(exc)}}), flush=True)
        return 1
    finally:
        client.close()
        channel.close()
        if server is not None:
            server.close()
    print(json.dumps({"runnerHost": summary(result, containment)}), flush=True)
    return 0 if result.reported or result.outcome == "quarantined" else 1


if __name__ == "__main__":
    sys.exit(main())
