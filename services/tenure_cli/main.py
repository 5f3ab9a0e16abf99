"""`tenure`: up, broker, topics, tail, replay, rebuild, runs, lease, incidents, breakers, schedules."""

from __future__ import annotations

import argparse
import sys

from services.tenure_cli import breakers, local_mode, resources, schedules, supervisor, topic_tools
from services.tenure_cli.instances import SCALABLE, parse_instances

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tenure", description="Tenure control plane")
    sub = parser.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="start broker (if none configured), topics, services and API")
    up.add_argument("--port", type=int, default=None, help="API port (default TENURE_API_PORT or 8000)")
    up.add_argument(
        "--ready-timeout",
        type=float,
        default=120.0,
        help="seconds each start-up phase may take until every service is ready (default 120)",
    )
    # The managed runner host (QUA-1, EXE-7) runs an agent command, so it starts only when asked.
    up.add_argument(
        "--runner-host", metavar="RUN_ID", default=None, help="also run a managed runner host for RUN_ID"
    )
    up.add_argument(
        "--agent-command", default=None, help="the agent command the runner host runs (shell words)"
    )
    up.add_argument(
        "--runner-host-claim-wait",
        type=float,
        default=3600.0,
        help="seconds the runner host waits for RUN_ID to be submitted (default 3600)",
    )
    # Several instances of the consumer-group processors (issue 16): "3", "coordinator=3,saga=2".
    up.add_argument(
        "--instances",
        default=None,
        type=_instances,
        metavar="N|SERVICE=N,...",
        help="run N instances of each scalable processor "
        f"({', '.join(SCALABLE)}), or per service: coordinator=3,saga=2 (default 1)",
    )
    up.set_defaults(func=supervisor.up)

    broker = sub.add_parser("broker", help="the bundled Kafka broker (fetch/start/stop/status/run)")
    broker.add_argument("action", choices=["fetch", "start", "stop", "status", "run"])
    broker.set_defaults(func=supervisor.broker)

    topics = sub.add_parser("topics", help="create or list Tenure's topics")
    topics.add_argument("action", choices=["create", "list"])
    topics.set_defaults(func=supervisor.topics)

    topic_tools.add_parsers(sub)

    rebuild = sub.add_parser("rebuild", help="rebuild the Run views from offset 0 (projections stopped)")
    rebuild.add_argument(
        "--fold-every-event",
        action="store_true",
        help="decode and fold every event of runs.events instead of seeding the runs' states from "
        "the state changelog (runs.states); slower, the same views",
    )
    rebuild.set_defaults(func=supervisor.rebuild)

    resources.add_parsers(sub)
    breakers.add_parser(sub)
    schedules.add_parser(sub)
    local_mode.add_parser(sub)  # tenure local run|sync (EXE-16)
    return parser


def _instances(text: str) -> str:
    """Checked when the command line is parsed, so a typo is a usage error before anything starts."""
    try:
        parse_instances(text, supervisor.SERVICES)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--instances: ")) from None
    return text


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # the CLI's last line: a clear message, not a traceback
        print(f"tenure {args.command}: {exc}", file=sys.stderr)
        return 1
