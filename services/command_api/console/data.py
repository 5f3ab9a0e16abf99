"""What the console's pages show, read through the same context and views the JSON routes use.

Nothing here folds events: every value comes from `ApiContext` (its run and trajectory views),
the projector's views (`deps.views`), or the boards the JSON routes read (the breakers', the
schedules', the quarantine fold), rendered by the JSON routes' own functions (`describe_breaker`,
`schedule_view`, `render_quarantine`). The one thing the console adds is the runs list's filters
beyond status (tenant, label, submission time range, free text on ids): `GET /runs` pages by
status only, so `find_runs` walks those pages in submission order and keeps what matches, within
a bound on how many runs one request may look at.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from services.command_api.context import ApiContext
from services.command_api.models import STATUS_VALUES
from services.command_api.problems import ApiProblem
from services.command_api.quarantine_deps import quarantine_deps
from services.command_api.routes_breakers import describe_breaker
from services.command_api.watchdog_delivery import watchdog_view
from services.projections.store import BadCursor
from services.quarantine.view import render_artifact, render_quarantine
from services.schedules.view import schedule_view

__all__ = [
    "MAX_LIMIT",
    "MAX_SCAN",
    "RunListing",
    "RunQuery",
    "breakers",
    "existing_run",
    "find_runs",
    "incidents",
    "parse_instant",
    "quarantine",
    "run_query",
    "schedules",
    "trajectory",
    "watchdog",
]

MAX_LIMIT = 200
# How many runs one request of the list may look at before it answers with what it found and a
# cursor to go on from (a filter that matches little must not make one request read everything).
MAX_SCAN = 2_000
MAX_TEXT = 200
MAX_CURSOR = 500


@dataclass(frozen=True)
class RunQuery:
    """The runs list's filters, validated (None: not filtered)."""

    status: str | None = None
    tenant: str | None = None
    label: tuple[str, str | None] | None = None  # key, and the value it must have (None: any)
    since_ms: int | None = None
    until_ms: int | None = None
    text: str | None = None
    limit: int = 50
    cursor: str | None = None

    def matches(self, view: dict[str, Any]) -> bool:
        if self.tenant is not None and view.get("tenant") != self.tenant:
            return False
        if self.label is not None:
            key, value = self.label
            labels = view.get("labels") or {}
            if key not in labels or (value is not None and labels[key] != value):
                return False
        submitted = _ms(view.get("submittedAt"))
        if self.since_ms is not None and submitted < self.since_ms:
            return False
        if self.until_ms is not None and submitted > self.until_ms:
            return False
        return self.text is None or any(self.text in i.lower() for i in _ids_of(view))


@dataclass
class RunListing:
    items: list[dict[str, Any]] = field(default_factory=list)
    next_cursor: str | None = None
    scanned: int = 0
    scan_bounded: bool = False  # stopped at MAX_SCAN before the page was full


def _ms(value: Any) -> int:
    """A view's time as epoch ms, whether the view gives epoch ms or RFC 3339 text."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, str) and value:
        try:
            return parse_instant("time", value) or 0
        except ApiProblem:
            return 0
    return 0


def _ids_of(view: dict[str, Any]) -> list[str]:
    """The ids a free-text search looks in: the run's own and those of its leases and attempts."""
    ids = [str(view.get(k) or "") for k in ("runId", "idempotencyKey", "parentRunId", "agentRevisionId")]
    ids += [str(a.get("attemptId") or "") for a in view.get("attempts") or []]
    leases = [view.get("lease"), *(view.get("leaseHistory") or [])]
    ids += [str(lease.get("leaseId") or "") for lease in leases if lease]
    return [i for i in ids if i]


def _text(name: str, value: str | None, limit: int = MAX_TEXT) -> str | None:
    """An optional text filter: empty is none; bounded; no control character."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    if len(value) > limit:
        raise ApiProblem("validation-failed", f"{name}: at most {limit} characters")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise ApiProblem("validation-failed", f"{name}: no control character")
    return value


def parse_instant(name: str, value: str | None) -> int | None:
    """An RFC 3339 time (or a browser's datetime-local, read as UTC) as epoch ms."""
    text = _text(name, value, 40)
    if text is None:
        return None
    try:
        moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError as exc:
        raise ApiProblem(
            "validation-failed", f"{name}: an RFC 3339 time such as 2026-01-31T12:00:00Z, not {text!r}"
        ) from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return int(moment.timestamp() * 1000)


def run_query(
    status: str | None,
    tenant: str | None,
    label: str | None,
    since: str | None,
    until: str | None,
    q: str | None,
    limit: int | None,
    cursor: str | None,
) -> RunQuery:
    """The filters of a request, or 422 validation-failed naming the one that is wrong."""
    status = _text("status", status, 40)
    if status is not None and status not in STATUS_VALUES:
        raise ApiProblem("validation-failed", f"status must be one of {', '.join(STATUS_VALUES)}")
    wanted = _text("label", label)
    pair: tuple[str, str | None] | None = None
    if wanted is not None:
        key, eq, value = wanted.partition("=")
        if not key.strip():
            raise ApiProblem("validation-failed", "label: key or key=value")
        pair = (key.strip(), value.strip() if eq else None)
    since_ms, until_ms = parse_instant("since", since), parse_instant("until", until)
    if since_ms is not None and until_ms is not None and since_ms > until_ms:
        raise ApiProblem("validation-failed", "since must not be after until")
    if limit is not None and not 1 <= limit <= MAX_LIMIT:
        raise ApiProblem("validation-failed", f"limit: 1 to {MAX_LIMIT}")
    text = _text("q", q)
    return RunQuery(
        status=status,
        tenant=_text("tenant", tenant),
        label=pair,
        since_ms=since_ms,
        until_ms=until_ms,
        text=text.lower() if text is not None else None,
        limit=limit or 50,
        cursor=_text("cursor", cursor, MAX_CURSOR),
    )


async def find_runs(ctx: ApiContext, query: RunQuery) -> RunListing:
    """Up to `query.limit` runs that match, in submission order, from the views' status pages.

    Each page asks for as many runs as are still missing, so the store's cursor after the last
    page is exactly where the next request goes on (no run is skipped or shown twice)."""
    listing = RunListing()
    cursor = query.cursor
    while len(listing.items) < query.limit:
        if listing.scanned >= MAX_SCAN:
            listing.scan_bounded = True
            break
        want = min(query.limit - len(listing.items), MAX_SCAN - listing.scanned)
        try:
            page = await ctx.in_thread("the run views", ctx.deps.views.list, query.status, want, cursor)
        except BadCursor as exc:
            raise ApiProblem("invalid-cursor", str(exc)) from exc
        listing.scanned += len(page.items)
        for view in page.items:
            if query.until_ms is not None and _ms(view.get("submittedAt")) > query.until_ms:
                return listing  # submission order: nothing later can match
            if query.matches(view):
                listing.items.append(view)
        cursor = page.next_cursor
        if cursor is None:
            break
    listing.next_cursor = cursor
    return listing


async def existing_run(ctx: ApiContext, run_id: str) -> dict[str, Any]:
    view = await ctx.view(run_id)
    if view is None:
        raise ApiProblem("run-not-found", f"run {run_id} does not exist", runId=run_id)
    return view


async def trajectory(ctx: ApiContext, run_id: str) -> dict[str, Any] | None:
    return await ctx.trajectory_view(run_id)


async def watchdog(ctx: ApiContext, run_id: str) -> dict[str, Any] | None:
    return await watchdog_view(ctx, run_id)


async def quarantine(ctx: ApiContext, run_id: str) -> dict[str, Any]:
    """The fold's quarantine view (as GET /runs/{runId}/quarantine renders it) and the envelopes
    of its tainted and suspect artifacts, whose parents are the taint graph's edges."""
    board = quarantine_deps(ctx).board
    state = board.quarantine(run_id)
    graph = board.graph(state.tenant) if state is not None else None
    view = render_quarantine(run_id, state, graph)
    envelopes = []
    if graph is not None:
        shown = {str(a.get("artifactId") if isinstance(a, dict) else a) for a in view["taintedArtifacts"]}
        shown |= {str(a.get("artifactId") if isinstance(a, dict) else a) for a in view["suspectArtifacts"]}
        envelopes = [render_artifact(a) for i, a in sorted(graph.artifacts.items()) if i in shown]
    return {**view, "envelopes": envelopes}


def breakers(ctx: ApiContext) -> list[dict[str, Any]]:
    """Every breaker as GET /breakers describes it (503 while the board is not current)."""
    board = ctx.deps.breakers
    if board is None:
        raise ctx.unavailable("the circuit breakers are not followed by this API")
    if not board.wait_until_current(0.0):
        raise ctx.unavailable("the circuit breakers are still being read from breakers.events")
    now = ctx.deps.clock.now_ms()
    return [describe_breaker(board, state, now, detail=True) for _, state in sorted(board.states().items())]


async def schedules(ctx: ApiContext, upcoming: int = 3) -> list[dict[str, Any]]:
    """Every schedule as GET /schedules/{id} shows it, with its next firings."""
    board = ctx.deps.schedules
    if board is None:
        raise ctx.unavailable("the schedules view is not configured in this API")
    if not await ctx.in_thread("the schedules view", board.wait_current, max(ctx.remaining() - 0.5, 0.1)):
        raise ctx.unavailable(f"the schedules view is still reading schedules.events ({board.failure})")
    now = ctx.deps.clock.now_ms()
    states = sorted(board.states(), key=lambda s: s.schedule_id)
    return [schedule_view(s, now, upcoming=upcoming) for s in states]


async def incidents(ctx: ApiContext) -> list[dict[str, Any]]:
    """The open incidents, as GET /incidents lists them."""
    return await ctx.in_thread("the incident views", ctx.deps.views.open_incidents)
