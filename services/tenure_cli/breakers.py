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
import json
import sys
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

import httpx

from services.common.auth import bearer
from services.common.settings import TenureSettings
from services.tenure_cli.readiness import probe_host

__all__ = ["STATUSES", "add_parser", "breaker_sentence", "open_client"]

STATUSES = ("closed", "open", "half-open", "forced-open", "disabled")
OVERRIDES = {
    "force-open": "fail every call to the endpoint fast until a reset",
    "disable": "let every call through, counting nothing, until a reset",
    "reset": "close the breaker: an empty window and the base cooldown",
}


def open_client(base_url: str, timeout_s: float) -> httpx.Client:
    """The HTTP client of one command (tests replace this with the in-process API's)."""
    return httpx.Client(base_url=base_url, timeout=timeout_s)


# --- rendering --------------------------------------------------------------------------------


def _duration(ms: Any) -> str:
    if not isinstance(ms, int) or isinstance(ms, bool):
        return "-"
    if ms < 1000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms / 1000:g}s"
    return f"{ms // 60_000}m{(ms % 60_000) // 1000:02d}s"


def _time(value: Any) -> str:
    """An epoch-ms field (a decoded record) or an RFC 3339 one (the API's) as RFC 3339."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        moment = dt.datetime.fromtimestamp(value / 1000, tz=dt.UTC)
        return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return str(value) if value else "-"


def _percent(value: Any) -> str:
    return f"{value:.0%}" if isinstance(value, int | float) and not isinstance(value, bool) else "-"


def _because(fields: Mapping[str, Any]) -> str:
    who = fields.get("actor") or fields.get("by") or "?"
    was = fields.get("previousStatus") or "new"
    return f"by {who} (was {was}): {fields.get('reason', '')}"


def _outcome(f: Mapping[str, Any]) -> str:
    text = f"{f.get('outcome')} from {f.get('instanceId')} in {_duration(f.get('durationMs'))}"
    if f.get("failure"):
        text += ", a failure"
    if f.get("counted") is False:
        text += ", not counted (the breaker is not closed)"
    return text + (f": {f['detail']}" if f.get("detail") else "")


_SENTENCES: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "CallOutcomeRecorded": _outcome,
    "BreakerOpened": lambda f: (
        f"OPENED: {f.get('failures')}/{f.get('calls')} calls failed ({_percent(f.get('errorRate'))} > "
        f"{_percent(f.get('threshold'))}); calls fail fast for {_duration(f.get('cooldownMs'))}, "
        f"half-open at {_time(f.get('halfOpenAt'))}"
    ),
    "BreakerHalfOpened": lambda f: (
        f"HALF-OPEN after a {_duration(f.get('cooldownMs'))} cooldown: one canary may probe"
    ),
    "CanaryGranted": lambda f: (
        f"canary {f.get('canaryId')} granted to {f.get('instanceId')} until {_time(f.get('expiresAt'))}"
        + (f" (replaces expired {f['expiredCanaryId']})" if f.get("expiredCanaryId") else "")
    ),
    "CanaryExpired": lambda f: (
        f"canary {f.get('canaryId')} of {f.get('instanceId')} expired unreported; the slot is free"
    ),
    "BreakerClosed": lambda f: (
        f"CLOSED: the canary of {f.get('instanceId')} succeeded in {_duration(f.get('durationMs'))} "
        f"after {_duration(f.get('openForMs'))} open"
    ),
    "BreakerReopened": lambda f: (
        f"RE-OPENED: the canary of {f.get('instanceId')} failed ({f.get('outcome')}"
        + (f": {f['detail']}" if f.get("detail") else "")
        + f"); cooldown {_duration(f.get('previousCooldownMs'))} -> {_duration(f.get('cooldownMs'))}"
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


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "   ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows
    )


def _listing(body: Mapping[str, Any]) -> str:
    rows = [["ENDPOINT", "STATUS", "FAILS-FAST", "ERROR-RATE", "WINDOW", "COOLDOWN-LEFT", "CANARY", "AGE"]]
    for b in body.get("breakers", []):
        window = b.get("window") or {}
        rows.append([
            str(b.get("endpoint")),
            str(b.get("status")),
            "yes" if b.get("failsFast") else "no",
            _percent(b.get("errorRate")),
            f"{window.get('failures', 0)}/{window.get('calls', 0)}",
            _duration(b.get("cooldownRemainingMs")) if b.get("cooldownRemainingMs") else "-",
            str(b.get("canaryHolder") or "-"),
            _age(b.get("updatedAt"), body.get("serverTime")),
        ])
    if len(rows) == 1:
        return "No breakers: no call to a tool endpoint has been reported yet."
    return _table(rows)


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
            _duration(b.get("cooldownMs"))
            + (
                f", {_duration(b.get('cooldownRemainingMs'))} left (half-open at {b.get('halfOpenAt')})"
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


def _call(args: argparse.Namespace, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
    settings = TenureSettings()
    base = args.api_url or settings.cli_api_url or f"http://{probe_host(settings.api_host)}:{settings.api_port}"
    key = settings.cli_api_key if args.api_key is None else args.api_key
    headers = {"Accept": "application/json, application/problem+json", **bearer(key)}
    if getattr(args, "idempotency_key", None):
        headers["Idempotency-Key"] = args.idempotency_key
    http = open_client(base, settings.decision_timeout_s + 5.0)
    try:
        response = http.request(method, path, json=body, headers=headers)
    except httpx.TransportError as exc:
        raise RuntimeError(f"cannot reach the API at {base}: {exc}") from exc
    finally:
        http.close()
    try:
        answer = response.json()
    except ValueError:
        answer = {}
    if response.status_code >= 400:
        kind = str(answer.get("type") or "").rsplit("/", 1)[-1] if isinstance(answer, dict) else ""
        detail = answer.get("detail") if isinstance(answer, dict) else None
        raise RuntimeError(f"HTTP {response.status_code} {kind or 'error'}: {detail or response.text[:300]}")
    if response.status_code == 202:
        print(f"accepted, not yet decided: {answer.get('detail', '')}", file=sys.stderr)
    return answer


def _path(endpoint: str) -> str:
    return "/breakers/" + quote(endpoint, safe="/:@")


def _show(args: argparse.Namespace, body: Any, table: Callable[[Any], str]) -> int:
    print(json.dumps(body, indent=2) if args.output == "json" else table(body))
    return 0


def list_breakers(args: argparse.Namespace) -> int:
    params = f"?status={args.status}" if args.status else ""
    return _show(args, _call(args, "GET", "/breakers" + params), _listing)


def get_breaker(args: argparse.Namespace) -> int:
    return _show(args, _call(args, "GET", _path(args.endpoint)), _describe)


def override(args: argparse.Namespace) -> int:
    answer = _call(args, "POST", f"{_path(args.endpoint)}/{args.breaker_command}", {"reason": args.reason})
    if answer.get("status") == "pending":
        return _show(args, answer, lambda a: f"{args.endpoint}: pending (command {a.get('commandId')})")
    return _show(args, answer, _describe)


def _options(parser: argparse.ArgumentParser, top: bool) -> None:
    # Given on `tenure breakers` or on its subcommand: a subcommand's default must not override
    # what the top level parsed, so below the top there is none.
    default: Any = argparse.SUPPRESS
    parser.add_argument(
        "-o", "--output", choices=["table", "json"], default="table" if top else default, help="output format"
    )
    parser.add_argument(
        "--api-url", default=None if top else default, help="the API (default TENURE_CLI_API_URL)"
    )
    parser.add_argument(
        "--api-key", default=None if top else default, help="the key to present (default TENURE_CLI_API_KEY)"
    )


def add_parser(sub: Any) -> None:
    """`tenure breakers ...` under the CLI's subcommands."""
    top = sub.add_parser(
        "breakers",
        help="the tool endpoints' circuit breakers: list, get, force-open, disable, reset",
        description="The fleet-wide circuit breakers (BRK-1, BRK-2), through the command API.",
    )
    _options(top, True)
    top.add_argument("--status", choices=STATUSES, default=None, help="only breakers in this status")
    top.set_defaults(func=list_breakers, breaker_command="list")
    actions = top.add_subparsers(dest="breaker_command", metavar="{list,get,force-open,disable,reset}")
    listing = actions.add_parser("list", help="every breaker (the default)")
    _options(listing, False)
    listing.add_argument("--status", choices=STATUSES, default=argparse.SUPPRESS, help="only this status")
    listing.set_defaults(func=list_breakers)
    get = actions.add_parser("get", help="one breaker with its recent transitions")
    get.add_argument("endpoint", help="the tool endpoint id, e.g. ledger or env/vm.provision")
    _options(get, False)
    get.set_defaults(func=get_breaker)
    for name, what in OVERRIDES.items():
        action = actions.add_parser(name, help=f"{what} (operator)")
        action.add_argument("endpoint", help="the tool endpoint id")
        action.add_argument("--reason", required=True, help="why: recorded in the breaker's event")
        action.add_argument(
            "--idempotency-key", default=None, help="a retry with the same key is the same command"
        )
        _options(action, False)
        action.set_defaults(func=override)
