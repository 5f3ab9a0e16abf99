"""`tenure breakers`: the tool endpoints' circuit breakers, through the command API (BRK-1, BRK-2).

    tenure breakers [--status open] [-o table|json]         every breaker (GET /breakers)
    tenure breakers get <endpoint> [-o table|json]          one, with its transitions
    tenure breakers force-open <endpoint> --reason TEXT     fail every call fast until a reset
    tenure breakers disable <endpoint> --reason TEXT        let every call through until a reset
    tenure breakers reset <endpoint> --reason TEXT          back to closed, an empty window

The CLI asks the API (TENURE_CLI_API_URL, else the API this deployment serves) with the key
TENURE_CLI_API_KEY (`--api-url`, `--api-key`), so the API checks the operator role and records
who acted and why; `--idempotency-key` makes a retried override the same command. A problem
answer is printed as `HTTP <status> <type>: <detail>` and exits 1.

`breaker_sentence` renders one breaker event as a line for people; `tenure tail` and
`tenure breakers get` share it.
"""

from __future__ import annotations

import argparse
import datetime as dt
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

from services.tenure_cli.api_client import add_api_options, call, duration, rfc3339, show, table

__all__ = ["STATUSES", "add_parser", "breaker_sentence"]

STATUSES = ("closed", "open", "half-open", "forced-open", "disabled")
OVERRIDES = {
    "force-open": "fail every call to the endpoint fast until a reset",
    "disable": "let every call through, counting nothing, until a reset",
    "reset": "close the breaker: an empty window and the base cooldown",
}


# --- rendering --------------------------------------------------------------------------------


def _percent(value: Any) -> str:
    return f"{value:.0%}" if isinstance(value, int | float) and not isinstance(value, bool) else "-"


def _because(fields: Mapping[str, Any]) -> str:
    who = fields.get("actor") or fields.get("by") or "?"
    was = fields.get("previousStatus") or "new"
    return f"by {who} (was {was}): {fields.get('reason', '')}"


def _outcome(f: Mapping[str, Any]) -> str:
    text = f"{f.get('outcome')} from {f.get('instanceId')} in {duration(f.get('durationMs'))}"
    if f.get("failure"):
        text += ", a failure"
    if f.get("counted") is False:
        text += ", not counted (the breaker is not closed)"
    return text + (f": {f['detail']}" if f.get("detail") else "")


_SENTENCES: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "CallOutcomeRecorded": _outcome,
    "BreakerOpened": lambda f: (
        f"OPENED: {f.get('failures')}/{f.get('calls')} calls failed ({_percent(f.get('errorRate'))} > "
        f"{_percent(f.get('threshold'))}); calls fail fast for {duration(f.get('cooldownMs'))}, "
        f"half-open at {rfc3339(f.get('halfOpenAt'))}"
    ),
    "BreakerHalfOpened": lambda f: (
        f"HALF-OPEN after a {duration(f.get('cooldownMs'))} cooldown: one canary may probe"
    ),
    "CanaryGranted": lambda f: (
        f"canary {f.get('canaryId')} granted to {f.get('instanceId')} until {rfc3339(f.get('expiresAt'))}"
        + (f" (replaces expired {f['expiredCanaryId']})" if f.get("expiredCanaryId") else "")
    ),
    "CanaryExpired": lambda f: (
        f"canary {f.get('canaryId')} of {f.get('instanceId')} expired unreported; the slot is free"
    ),
    "BreakerClosed": lambda f: (
        f"CLOSED: the canary of {f.get('instanceId')} succeeded in {duration(f.get('durationMs'))} "
        f"after {duration(f.get('openForMs'))} open"
    ),
    "BreakerReopened": lambda f: (
        f"RE-OPENED: the canary of {f.get('instanceId')} failed ({f.get('outcome')}"
        + (f": {f['detail']}" if f.get("detail") else "")
        + f"); cooldown {duration(f.get('previousCooldownMs'))} -> {duration(f.get('cooldownMs'))}"
    ),
    "BreakerForcedOpen": lambda f: "FORCED OPEN " + _because(f),
    "BreakerDisabled": lambda f: "DISABLED " + _because(f),
    "BreakerReset": lambda f: "RESET to closed " + _because(f),
}


def breaker_sentence(kind: str, fields: Mapping[str, Any]) -> str | None:
    """One breaker event as a line for people; None when `kind` is not a breaker event."""
    render = _SENTENCES.get(kind)
    return render(fields) if render is not None else None


def _age(updated: Any, now: Any) -> str:
    try:
        then = dt.datetime.fromisoformat(str(updated).replace("Z", "+00:00"))
        at = dt.datetime.fromisoformat(str(now).replace("Z", "+00:00"))
    except ValueError:
        return "-"
    seconds = max(0, int((at - then).total_seconds()))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h" if seconds < 172_800 else f"{seconds // 86_400}d"


def _listing(body: Mapping[str, Any]) -> str:
    rows = [["ENDPOINT", "STATUS", "FAILS-FAST", "ERROR-RATE", "WINDOW", "COOLDOWN-LEFT", "CANARY", "AGE"]]
    for b in body.get("breakers", []):
        window = b.get("window") or {}
        rows.append(
            [
                str(b.get("endpoint")),
                str(b.get("status")),
                "yes" if b.get("failsFast") else "no",
                _percent(b.get("errorRate")),
                f"{window.get('failures', 0)}/{window.get('calls', 0)}",
                duration(b.get("cooldownRemainingMs")) if b.get("cooldownRemainingMs") else "-",
                str(b.get("canaryHolder") or "-"),
                _age(b.get("updatedAt"), body.get("serverTime")),
            ]
        )
    if len(rows) == 1:
        return "No breakers: no call to a tool endpoint has been reported yet."
    return table(rows)


def _describe(b: Mapping[str, Any]) -> str:
    window = b.get("window") or {}
    canary = b.get("canary")
    lines = [
        ("Endpoint", str(b.get("endpoint"))),
        ("Status", f"{b.get('status')}" + (" (calls fail fast)" if b.get("failsFast") else "")),
        (
            "Window",
            f"{window.get('failures', 0)} of {window.get('calls', 0)} calls failed "
            f"({_percent(b.get('errorRate'))}; W = {window.get('size') or '-'})",
        ),
        (
            "Cooldown",
            duration(b.get("cooldownMs"))
            + (
                f", {duration(b.get('cooldownRemainingMs'))} left (half-open at {b.get('halfOpenAt')})"
                if b.get("halfOpenAt")
                else ""
            ),
        ),
        (
            "Canary",
            f"{canary.get('holder')} until {canary.get('expiresAt')}"
            + ("" if canary.get("held") else " (expired)")
            if isinstance(canary, dict)
            else "-",
        ),
        ("Reason", str(b.get("reason") or "-")),
        ("Times opened", str(b.get("timesOpened", 0))),
        ("Updated", str(b.get("updatedAt") or "-")),
    ]
    text = "\n".join(f"{name + ':':<14}{value}" for name, value in lines)
    transitions = b.get("transitions") or []
    text += "\nTransitions:" + ("" if transitions else " none")
    for t in transitions:
        sentence = breaker_sentence(str(t.get("type")), t) or ""
        text += f"\n  {t.get('at')}  {t.get('type')!s:<18} {sentence}"
    return text


# --- commands -----------------------------------------------------------------------------------


def _path(endpoint: str) -> str:
    return "/breakers/" + quote(endpoint, safe="/:@")


def list_breakers(args: argparse.Namespace) -> int:
    params = f"?status={args.status}" if args.status else ""
    return show(args, call(args, "GET", "/breakers" + params), _listing)


def get_breaker(args: argparse.Namespace) -> int:
    return show(args, call(args, "GET", _path(args.endpoint)), _describe)


def override(args: argparse.Namespace) -> int:
    answer = call(args, "POST", f"{_path(args.endpoint)}/{args.breaker_command}", {"reason": args.reason})
    if answer.get("status") == "pending":
        return show(args, answer, lambda a: f"{args.endpoint}: pending (command {a.get('commandId')})")
    return show(args, answer, _describe)


def add_parser(sub: Any) -> None:
    """`tenure breakers ...` under the CLI's subcommands."""
    top = sub.add_parser(
        "breakers",
        help="the tool endpoints' circuit breakers: list, get, force-open, disable, reset",
        description="The fleet-wide circuit breakers (BRK-1, BRK-2), through the command API.",
    )
    add_api_options(top, True)
    top.add_argument("--status", choices=STATUSES, default=None, help="only breakers in this status")
    top.set_defaults(func=list_breakers, breaker_command="list")
    actions = top.add_subparsers(dest="breaker_command", metavar="{list,get,force-open,disable,reset}")
    listing = actions.add_parser("list", help="every breaker (the default)")
    add_api_options(listing, False)
    listing.add_argument("--status", choices=STATUSES, default=argparse.SUPPRESS, help="only this status")
    listing.set_defaults(func=list_breakers)
    get = actions.add_parser("get", help="one breaker with its recent transitions")
    get.add_argument("endpoint", help="the tool endpoint id, e.g. ledger or env/vm.provision")
    add_api_options(get, False)
    get.set_defaults(func=get_breaker)
    for name, what in OVERRIDES.items():
        action = actions.add_parser(name, help=f"{what} (operator)")
        action.add_argument("endpoint", help="the tool endpoint id")
        action.add_argument("--reason", required=True, help="why: recorded in the breaker's event")
        action.add_argument(
            "--idempotency-key", default=None, help="a retry with the same key is the same command"
        )
        add_api_options(action, False)
        action.set_defaults(func=override)
