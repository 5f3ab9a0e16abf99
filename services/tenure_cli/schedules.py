"""`tenure schedules`: schedules through the command API (EXE-14), kubectl-like.

    tenure schedules [list] [--tenant T] [-o table|json]      every schedule (GET /schedules)
    tenure schedules describe <id> [--next N] [-o table|json] one: next firings (local and UTC), history
    tenure schedules trigger <id> [--reason TEXT]             a manual run now (its own key)

The API is TENURE_CLI_API_URL (else this deployment's) with the key TENURE_CLI_API_KEY
(`--api-url`, `--api-key`); a problem answer is printed as `HTTP <status> <type>: <detail>` and
exits 1 (services/tenure_cli/api_client.py).
"""

from __future__ import annotations

import argparse
from typing import Any

from services.tenure_cli.api_client import add_api_options, call, show, table

__all__ = ["add_parser", "describe_table", "list_table"]


def list_table(body: Any) -> str:
    rows = [("NAME", "TENANT", "STATUS", "CRON", "ZONE", "NEXT (UTC)", "FIRED", "SKIPPED")]
    for s in body.get("items", []):
        rows.append(
            (
                s["scheduleId"],
                s["tenant"],
                s["status"],
                s["cron"],
                s["timeZone"],
                s.get("nextRunAt") or "-",
                str(s.get("fired", 0)),
                str(s.get("skipped", 0)),
            )
        )
    if len(rows) == 1:
        return "No schedules."
    return table(rows)


def describe_table(s: Any) -> str:
    dst = s.get("dst", {})
    lines = [
        ("Name", s["scheduleId"]),
        ("Tenant", s["tenant"]),
        ("Owner", s["owner"]),
        ("Status", s["status"]),
        ("Agent revision", s["agentRevisionId"]),
        ("Schedule", f"{s['cron']} ({s['timeZone']})"),
        ("Policies", f"overlap={s['overlapPolicy']} misfire={s['misfirePolicy']}"),
        ("DST", f"nonexistent={dst.get('nonexistent')} repeated={dst.get('repeated')}"),
        ("Active runs", ", ".join(s.get("activeRuns") or []) or "-"),
        ("Pending", (s.get("pending") or {}).get("firingKey", "-")),
    ]
    text = "\n".join(f"{name + ':':<16}{value}" for name, value in lines)
    text += "\nNext firings:" + ("" if s.get("nextFirings") else " none")
    for f in s.get("nextFirings", []):
        text += f"\n  {f['local']:<27} {f['utc']}"
    history = s.get("history") or []
    text += "\nFirings:" + ("" if history else " none")
    for f in history:
        what = "manual" if f.get("manual") else f["scheduledAtLocal"]
        run, detail = f.get("runId") or "", f.get("detail") or ""
        text += f"\n  {f['scheduledAt']:<22} {f['status']:<10} {what:<27} {run} {detail}"
    return text


def list_schedules(args: argparse.Namespace) -> int:
    query = f"?tenant={args.tenant}" if getattr(args, "tenant", None) else ""
    return show(args, call(args, "GET", "/schedules" + query), list_table)


def describe_schedule(args: argparse.Namespace) -> int:
    return show(args, call(args, "GET", f"/schedules/{args.schedule_id}?next={args.next}"), describe_table)


def trigger_schedule(args: argparse.Namespace) -> int:
    answer = call(args, "POST", f"/schedules/{args.schedule_id}/trigger", {"reason": args.reason})
    if answer.get("status") == "pending":
        return show(args, answer, lambda a: f"{args.schedule_id}: pending (command {a.get('commandId')})")
    return show(args, answer, describe_table)


def add_parser(sub: Any) -> None:
    """`tenure schedules ...` under the CLI's subcommands."""
    top = sub.add_parser(
        "schedules",
        help="schedules: list, describe, trigger",
        description="Schedules (EXE-14), through the command API.",
    )
    add_api_options(top, True)
    top.add_argument("--tenant", default=None, help="only this tenant's schedules")
    top.set_defaults(func=list_schedules, schedule_command="list")
    actions = top.add_subparsers(dest="schedule_command", metavar="{list,describe,trigger}")
    listing = actions.add_parser("list", help="every schedule (the default)")
    add_api_options(listing, False)
    listing.add_argument("--tenant", default=argparse.SUPPRESS, help="only this tenant's schedules")
    listing.set_defaults(func=list_schedules)
    describe = actions.add_parser("describe", help="one schedule: next firings, history")
    describe.add_argument("schedule_id")
    describe.add_argument("--next", type=int, default=5, help="how many next firings to show")
    add_api_options(describe, False)
    describe.set_defaults(func=describe_schedule)
    trigger = actions.add_parser("trigger", help="a manual run now (the owner or an operator)")
    trigger.add_argument("schedule_id")
    trigger.add_argument("--reason", default="", help="recorded with the firing")
    trigger.add_argument("--idempotency-key", default=None, help="a retry with the same key is the same run")
    add_api_options(trigger, False)
    trigger.set_defaults(func=trigger_schedule)
