"""`tenure runs|lease|incidents`: the resources operators ask about, with kubectl's verbs.

    tenure runs submit --tenant T --spec JSON|@FILE --timeout S   POST /runs (-o name: its id)
    tenure runs list [--status S] [--limit N] [--all] [-w]     GET /runs
    tenure runs describe RUN [-w] [--as-of T|vN]               the run, its lease and its trajectory
    tenure runs history RUN                                    every event of the run, in order
    tenure runs cancel RUN [--reason TEXT]                     POST /runs/RUN/cancel
    tenure runs retry RUN [--acknowledge-repeated-effects]     POST /runs/RUN/retry
    tenure lease show RUN [-w]                                 the LEASE-2 record and earlier leases
    tenure lease takeover RUN --holder H --reason TEXT         revoke and re-grant (operator)
    tenure incidents list                                      open incidents, oldest first
    tenure incidents resolve ID --run RUN --resolution R       resume | compensated-manually | abandon

Every verb takes `-o table|json|yaml`, `--api` and `--api-key` (services/tenure_cli/api_client.py).
`-w/--watch` prints again whenever what it shows changes (a list prints only the rows that
changed, as `kubectl get -w` does), until Ctrl-C or `--watch-timeout`. Writes take
`--idempotency-key`, so a retried command is the same command. Tables show times in RFC 3339.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from urllib.parse import quote

from services.tenure_cli.api_client import add_api_options, call, duration, rfc3339, show, table

__all__ = ["add_parsers", "describe_run", "history_table", "lease_text", "runs_table"]

_RESOLUTIONS = ("resume", "compensated-manually", "abandon")


def _run_path(run_id: str, rest: str = "") -> str:
    return f"/runs/{quote(run_id, safe='')}{rest}"


# --- rendering ----------------------------------------------------------------------------------


def _run_row(run: Mapping[str, Any]) -> list[str]:
    lease = run.get("lease") or {}
    return [
        str(run.get("runId")),
        str(run.get("tenant")),
        str(run.get("status")),
        str(len(run.get("attempts") or [])),
        str(lease.get("holder") or "-"),
        str(lease.get("epoch") or "-"),
        str(lease.get("certainty") or "-"),
        rfc3339(run.get("updatedAt")),
    ]


_RUN_HEADER = ["RUN", "TENANT", "STATUS", "ATTEMPTS", "HOLDER", "EPOCH", "LEASE", "UPDATED"]


def runs_table(body: Mapping[str, Any]) -> str:
    items = body.get("items") or []
    if not items:
        return "No runs."
    text = table([_RUN_HEADER, *(_run_row(r) for r in items)])
    if body.get("nextCursor"):
        text += f"\n(more: --cursor {body['nextCursor']} or --all)"
    return text


def lease_text(lease: Mapping[str, Any] | None) -> str:
    if not lease:
        return "  no lease"
    rule = lease.get("expiryRule") or {}
    lines = [
        ("Holder", f"{lease.get('holder')} ({lease.get('holderKind')})"),
        ("Principal", str(lease.get("holderPrincipal") or "-")),
        ("Attempt", str(lease.get("attemptId"))),
        ("Epoch", str(lease.get("epoch"))),
        ("Certainty", f"{lease.get('certainty')} since {rfc3339(lease.get('certaintyChangedAt'))}"),
        ("Issued", rfc3339(lease.get("issuedAt"))),
        ("Expires", rfc3339(lease.get("expiresAt")) + " (the coordinator's clock)"),
        (
            "Terms",
            f"{rule.get('leaseSeconds')} s lease, heartbeat {rule.get('heartbeatSeconds')} s, "
            f"at risk after {duration(rule.get('atRiskAfterMs'))}",
        ),
        ("Renewals", str(len(lease.get("renewals") or []))),
        ("Ended", rfc3339(lease.get("endedAt"))),
    ]
    if lease.get("takeoverReason"):
        lines.append(("Taken over", str(lease["takeoverReason"])))
    text = "\n".join(f"  {name + ':':<12}{value}" for name, value in lines)
    effects = lease.get("effects") or []
    text += "\n  Effects:" + ("" if effects else " none")
    for e in effects:
        text += (
            f"\n    {e.get('effectId')}  {e.get('tool', '')} {e.get('operation', '')}  "
            f"{e.get('outcome') or 'pending'}  {rfc3339(e.get('recordedAt'))}"
        )
    return text


def history_table(run: Mapping[str, Any], last: int | None = None) -> str:
    entries = list(run.get("history") or [])
    if last is not None:
        entries = entries[-last:]
    rows = [["VERSION", "OCCURRED", "EVENT", "ACTOR", "CAUSATION"]]
    for h in entries:
        rows.append(
            [
                str(h.get("version")),
                rfc3339(h.get("occurredAt")),
                str(h.get("type")),
                str(h.get("actor") or "-"),
                str(h.get("causationId") or "-"),
            ]
        )
    return table(rows) if len(rows) > 1 else "No events."


def _trajectory_text(trajectory: Mapping[str, Any] | None) -> str:
    if not trajectory:
        return "  none"
    steps = trajectory.get("steps") or []
    lines = [f"  Status:     {trajectory.get('status')} (version {trajectory.get('version')})"]
    for s in steps:
        lines.append(f"  {s.get('index')!s:>3}. {s.get('tool')!s:<22} {s.get('status')}")
    stack = trajectory.get("compensationStack") or trajectory.get("stack") or []
    lines.append(f"  Compensation stack: {len(stack)} entr{'y' if len(stack) == 1 else 'ies'}")
    return "\n".join(lines)


def describe_run(body: Mapping[str, Any]) -> str:
    run = body.get("run") or {}
    as_of = run.get("asOf")
    lines = [
        ("Run", str(run.get("runId")) + (f" as of version {as_of['version']}" if as_of else "")),
        ("Tenant", str(run.get("tenant"))),
        ("Status", str(run.get("status")) + (f" ({run['statusReason']})" if run.get("statusReason") else "")),
        ("Version", str(run.get("version"))),
        ("Submitted", f"{rfc3339(run.get('submittedAt'))} by {run.get('submittedBy') or '-'}"),
        ("Updated", rfc3339(run.get("updatedAt"))),
        ("Deadline", rfc3339(run.get("deadlineAt"))),
        ("Attempts", f"{len(run.get('attempts') or [])} of {run.get('maxAttempts')}"),
        ("Retry-safe", "yes" if run.get("retrySafe") else "no"),
        ("Labels", ", ".join(f"{k}={v}" for k, v in (run.get("labels") or {}).items()) or "-"),
    ]
    text = "\n".join(f"{name + ':':<12}{value}" for name, value in lines)
    text += "\nLease:\n" + lease_text(run.get("lease"))
    text += "\nTrajectory:\n" + _trajectory_text(body.get("trajectory"))
    text += "\nRecent events:\n" + history_table(run, last=10)
    return text


def _lease_show(body: Mapping[str, Any]) -> str:
    text = f"Run {body.get('runId')} ({body.get('runStatus')})\nLease:\n" + lease_text(body.get("lease"))
    earlier = body.get("previousLeases") or []
    text += "\nEarlier leases:" + ("" if earlier else " none")
    for lease in earlier:
        text += (
            f"\n  epoch {lease.get('epoch')}: {lease.get('holder')}, {lease.get('certainty')}, "
            f"ended {rfc3339(lease.get('endedAt'))}"
        )
    return text


def _incidents_table(body: Mapping[str, Any]) -> str:
    items = body.get("items") or []
    if not items:
        return "No open incidents."
    rows = [["INCIDENT", "RUN", "OPENED", "REASON"]]
    for i in items:
        reason = str(i.get("reason") or i.get("kind") or i.get("detail") or "-")
        rows.append([str(i.get("incidentId")), str(i.get("runId")), rfc3339(i.get("openedAt")), reason[:80]])
    return table(rows)


# --- watching -----------------------------------------------------------------------------------


def _polls(args: argparse.Namespace, fetch: Callable[[], Any]) -> Iterator[Any]:
    """`fetch()` once, or, with --watch, again every --interval until Ctrl-C or --watch-timeout."""
    yield fetch()
    if not getattr(args, "watch", False):
        return
    stop_at = time.monotonic() + args.watch_timeout if args.watch_timeout else None
    while stop_at is None or time.monotonic() < stop_at:
        time.sleep(args.interval)
        yield fetch()


def _print_changed(args: argparse.Namespace, body: Any, render: Callable[[Any], str], first: bool) -> None:
    if not first:  # one document per change: YAML's separator, else a blank line
        print("---" if args.output == "yaml" else "")
    show(args, body, render)
    sys.stdout.flush()


def _watch_one(args: argparse.Namespace, fetch: Callable[[], Any], render: Callable[[Any], str]) -> int:
    last: str | None = None
    for body in _polls(args, fetch):
        key = json.dumps(body, sort_keys=True)
        if key != last:
            _print_changed(args, body, render, last is None)
            last = key
    return 0


# --- commands -----------------------------------------------------------------------------------


def list_runs(args: argparse.Namespace) -> int:
    def fetch() -> dict[str, Any]:
        params: dict[str, Any] = {"status": args.status, "limit": args.limit, "cursor": args.cursor}
        page = call(args, "GET", "/runs", params=params)
        items = list(page.get("items") or [])
        while args.all and page.get("nextCursor"):
            page = call(args, "GET", "/runs", params={**params, "cursor": page["nextCursor"]})
            items.extend(page.get("items") or [])
        return {"items": items, "nextCursor": None if args.all else page.get("nextCursor")}

    if not args.watch or args.output != "table":
        return _watch_one(args, fetch, runs_table)
    seen: dict[str, list[str]] = {}
    for page in _polls(args, fetch):
        rows = [_run_row(r) for r in page["items"]]
        changed = [row for row in rows if seen.get(row[0]) != row]
        if not seen:
            print(runs_table(page), flush=True)
        elif changed:
            # kubectl get -w: only what changed, in the same columns, no header again.
            print(table([_RUN_HEADER, *changed]).split("\n", 1)[1], flush=True)
        seen.update({row[0]: row for row in rows})
    return 0


def _run_and_trajectory(args: argparse.Namespace) -> dict[str, Any]:
    if getattr(args, "as_of", None):
        # The run as it was, folded from the log; the trajectory has no point-in-time view.
        return {
            "run": call(args, "GET", _run_path(args.run_id), params={"asOf": args.as_of}),
            "trajectory": None,
        }
    run = call(args, "GET", _run_path(args.run_id))
    try:
        trajectory = call(args, "GET", _run_path(args.run_id, "/trajectory"))
    except RuntimeError as exc:  # a run without a trajectory is still a run
        if "trajectory-not-found" not in str(exc):
            raise
        trajectory = None
    return {"run": run, "trajectory": trajectory}


def describe(args: argparse.Namespace) -> int:
    return _watch_one(args, lambda: _run_and_trajectory(args), describe_run)


def history(args: argparse.Namespace) -> int:
    run = call(args, "GET", _run_path(args.run_id))
    if args.output == "table":
        print(history_table(run))
        return 0
    return show(args, run.get("history") or [], history_table)


def _spec(text: str) -> dict[str, Any]:
    """The ExecutionSpec given inline or as @file, which must hold a JSON object."""
    if text.startswith("@"):
        with open(text[1:], encoding="utf-8") as handle:
            text = handle.read()
    try:
        spec = json.loads(text)
    except ValueError as exc:
        raise RuntimeError(f"--spec is not JSON: {exc}") from exc
    if not isinstance(spec, dict):
        raise RuntimeError("--spec must be a JSON object")
    return spec


def submit(args: argparse.Namespace) -> int:
    if not args.idempotency_key:
        # Submitting is idempotent by key: say the one chosen, so a retry can be the same run.
        args.idempotency_key = uuid.uuid4().hex
        print(
            f"Idempotency-Key: {args.idempotency_key} (pass it again to retry this submission)",
            file=sys.stderr,
        )
    body: dict[str, Any] = {
        "tenant": args.tenant,
        "executionSpec": _spec(args.spec),
        "timeoutSeconds": args.timeout,
        "retrySafe": args.retry_safe,
        "maxAttempts": args.max_attempts,
    }
    if args.agent_revision:
        body["agentRevisionId"] = args.agent_revision
    answer = call(args, "POST", "/runs", body)
    return show(args, answer, lambda a: table([_RUN_HEADER, _run_row(a)]))


def cancel(args: argparse.Namespace) -> int:
    answer = call(args, "POST", _run_path(args.run_id, "/cancel"), {"reason": args.reason})
    return show(args, answer, lambda a: f"{a.get('runId', args.run_id)}: {a.get('status')}")


def retry(args: argparse.Namespace) -> int:
    body = {"reason": args.reason, "acknowledgeRepeatedEffects": args.acknowledge_repeated_effects}
    answer = call(args, "POST", _run_path(args.run_id, "/retry"), body)
    return show(args, answer, lambda a: f"{a.get('runId', args.run_id)}: {a.get('status')}")


def lease_show(args: argparse.Namespace) -> int:
    return _watch_one(args, lambda: call(args, "GET", _run_path(args.run_id, "/lease")), _lease_show)


def lease_takeover(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"reason": args.reason, "newHolder": args.holder, "holderKind": args.holder_kind}
    if args.lease_seconds is not None:
        body["leaseSeconds"] = args.lease_seconds
    answer = call(args, "POST", _run_path(args.run_id, "/lease/takeover"), body)
    return show(args, answer, lambda a: json.dumps(a, indent=2))


def _watchdog_text(body: Mapping[str, Any]) -> str:
    rollbacks = body.get("rollbacks") or {}
    text = (
        f"Run {body.get('runId')}: watchdog {body.get('status')} at turn {body.get('turn')}, "
        f"rollbacks {rollbacks.get('used', 0)}/{rollbacks.get('budget', '-')}"
    )
    if body.get("pendingRollback"):
        text += f"\nPending rollback: {body['pendingRollback']}"
    ladder = body.get("interventions") or []
    text += "\nInterventions:" + ("" if ladder else " none")
    for rung in ladder:
        text += (
            f"\n  level {rung.get('level')} {rung.get('code')} ({rung.get('interventionId')}), "
            f"issued {rung.get('issuedAt')}, acknowledged {rung.get('acknowledgedAt') or '-'}"
        )
    return text


def watchdog_show(args: argparse.Namespace) -> int:
    return _watch_one(args, lambda: call(args, "GET", _run_path(args.run_id, "/watchdog")), _watchdog_text)


def incidents_list(args: argparse.Namespace) -> int:
    return _watch_one(args, lambda: call(args, "GET", "/incidents"), _incidents_table)


def incidents_resolve(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"runId": args.run, "resolution": args.resolution, "note": args.note}
    if args.attempt_id:
        body["attemptId"], body["leaseEpoch"] = args.attempt_id, args.lease_epoch
    answer = call(args, "POST", f"/incidents/{quote(args.incident_id, safe='')}/resolve", body)
    return show(args, answer, lambda a: f"{args.incident_id}: trajectory {a.get('status')}")


# --- parsers ------------------------------------------------------------------------------------


def _verb(actions: Any, name: str, help_text: str, func: Callable[[argparse.Namespace], int]) -> Any:
    parser = actions.add_parser(name, help=help_text)
    add_api_options(parser, False)
    parser.set_defaults(func=func)
    return parser


def _watchable(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-w", "--watch", action="store_true", help="print again whenever it changes")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between polls (default 2)")
    parser.add_argument("--watch-timeout", type=float, default=None, help="stop watching after this long")


def _write(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--idempotency-key", default=None, help="a retry with the same key is the same command"
    )


def _resource(sub: Any, name: str, help_text: str) -> Any:
    top = sub.add_parser(name, help=help_text, description=help_text)
    add_api_options(top, True)
    return top.add_subparsers(dest=f"{name}_command", metavar="VERB", required=True)


def add_parsers(sub: Any) -> None:
    """`tenure runs`, `tenure lease`, `tenure watchdog` and `tenure incidents` under the CLI's subcommands."""
    runs = _resource(sub, "runs", "runs: submit, list, describe, history, cancel, retry")
    submitting = _verb(runs, "submit", "submit a run (idempotent by --idempotency-key)", submit)
    submitting.add_argument("--tenant", required=True)
    submitting.add_argument("--spec", required=True, help="the ExecutionSpec: a JSON object, or @file")
    submitting.add_argument("--timeout", type=int, required=True, help="seconds the whole run may take")
    submitting.add_argument("--retry-safe", action="store_true", help="Tenure may retry after lease loss")
    submitting.add_argument("--max-attempts", type=int, default=3)
    submitting.add_argument("--agent-revision", default=None, help="what the run runs")
    _write(submitting)
    listing = _verb(runs, "list", "runs, oldest submissions first", list_runs)
    listing.add_argument("--status", default=None, help="only runs in this status")
    listing.add_argument("--limit", type=int, default=50, help="runs per page (1-500, default 50)")
    listing.add_argument("--cursor", default=None, help="the page after this cursor")
    listing.add_argument("--all", action="store_true", help="follow every page")
    _watchable(listing)
    for verb, what, func in (
        ("describe", "one run: status, lease, trajectory, recent events", describe),
        ("history", "every event of one run, decoded, in order", history),
    ):
        parser = _verb(runs, verb, what, func)
        parser.add_argument("run_id", metavar="RUN")
        if verb == "describe":
            _watchable(parser)
            parser.add_argument(
                "--as-of",
                default=None,
                help="the run as it was at a time (RFC 3339, epoch ms) or a version (v12), from the log",
            )
    cancelling = _verb(runs, "cancel", "cancel a run (its submitter or an operator)", cancel)
    cancelling.add_argument("run_id", metavar="RUN")
    cancelling.add_argument("--reason", default="", help="recorded with the cancel")
    _write(cancelling)
    retrying = _verb(runs, "retry", "retry a run: in place if interrupted, a new run if it ended", retry)
    retrying.add_argument("run_id", metavar="RUN")
    retrying.add_argument("--reason", default="")
    retrying.add_argument(
        "--acknowledge-repeated-effects",
        action="store_true",
        help="I understand that external actions of the earlier attempt may repeat (EXE-5)",
    )
    _write(retrying)

    lease = _resource(sub, "lease", "a run's lease: show, takeover")
    showing = _verb(lease, "show", "the lease record (LEASE-2) and the earlier leases", lease_show)
    showing.add_argument("run_id", metavar="RUN")
    _watchable(showing)
    takeover = _verb(
        lease, "takeover", "revoke the lease and grant it to another holder (operator)", lease_takeover
    )
    takeover.add_argument("run_id", metavar="RUN")
    takeover.add_argument("--holder", required=True, help="the new holder")
    takeover.add_argument("--reason", required=True, help="why (LEASE-6): recorded as evidence")
    takeover.add_argument("--holder-kind", choices=["human", "runner"], default="human")
    takeover.add_argument("--lease-seconds", type=int, default=None)
    _write(takeover)

    watchdog = _resource(sub, "watchdog", "a run's semantic watchdog: show")
    watching = _verb(watchdog, "show", "the ladder: status, detections, interventions (WD-5)", watchdog_show)
    watching.add_argument("run_id", metavar="RUN")
    _watchable(watching)

    incidents = _resource(sub, "incidents", "incidents of frozen trajectories: list, resolve")
    _watchable(_verb(incidents, "list", "open incidents, oldest first", incidents_list))
    resolving = _verb(incidents, "resolve", "resolve an incident (operator)", incidents_resolve)
    resolving.add_argument("incident_id", metavar="INCIDENT")
    resolving.add_argument("--run", required=True, help="the run the incident is of")
    resolving.add_argument("--resolution", required=True, choices=_RESOLUTIONS)
    resolving.add_argument("--note", default="")
    resolving.add_argument("--attempt-id", default="", help="resume: the lease taken over after the freeze")
    resolving.add_argument("--lease-epoch", type=int, default=0, help="resume: that lease's epoch")
    _write(resolving)
