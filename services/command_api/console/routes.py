"""The web console at /ui: server-rendered pages whose data arrive as fragments (issue 17).

Two kinds of route:

* **Pages** (`/ui/runs`, `/ui/runs/{runId}`, `.../lease`, `.../trajectory`, `.../watchdog`,
  `.../quarantine`, `/ui/incidents`, `/ui/breakers`, `/ui/schedules`) are shells: navigation, the
  filter form, and empty containers naming the fragment each one shows. They hold no data, so
  they need no credential (a browser cannot send an Authorization header when it navigates).
  Their errors (a malformed run id, a bad filter) are a readable HTML page.
* **Fragments** (`/ui/fragments/...`) are the data, rendered to HTML by the same templates, and
  guarded exactly as the JSON routes are (`ctx.guarded()`: the caller's API key, the request's
  deadline). The page's script fetches each one every 2 s with the key the operator entered once
  (kept in the tab's sessionStorage, sent as `Authorization: Bearer`) and swaps it in when it
  changed. Their errors are problem+json, which the script shows as text.

Writes go nowhere near these routes: the incident form posts, from the script, to the JSON route
`POST /incidents/{incidentId}/resolve` with the same bearer key, so it authenticates and checks
the operator role exactly as that route does. No cookie carries the credential, so a page of
another site cannot make the browser send it: there is no CSRF to defend against.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from services.command_api.console import data
from services.command_api.console.render import html, static_file
from services.command_api.context import ApiContext
from services.command_api.models import STATUS_VALUES
from services.command_api.problems import CATALOG, ApiProblem
from services.common.auth import AuthError, Role
from services.common.problem_json import Problem

__all__ = ["HtmlErrorRoute", "console_router"]

RUN_TABS = ("lease", "trajectory", "watchdog", "quarantine")
MAX_TIMELINE = 2_000
DEFAULT_TIMELINE = 200
POLL_MS = 2_000

_Text = Annotated[str | None, Query(max_length=data.MAX_TEXT)]
_Instant = Annotated[str | None, Query(max_length=40)]
_Status = Annotated[str | None, Query(max_length=40)]
_Cursor = Annotated[str | None, Query(max_length=data.MAX_CURSOR)]
_Limit = Annotated[int | None, Query(ge=1, le=data.MAX_LIMIT)]


def _error_page(request: Request, slug: str, detail: str, status: int | None = None) -> HTMLResponse:
    body = CATALOG.body(slug, detail, str(request.url.path), status)
    return html("error.html", int(body["status"]), problem=body, section=None)


class HtmlErrorRoute(APIRoute):
    """A page route whose every error (a malformed path id, an invalid query) is an HTML page
    with the problem's title, status and detail, not a JSON body a browser shows raw."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except Problem as exc:
                return _error_page(request, exc.slug, exc.detail, exc.status)
            except AuthError as exc:
                return _error_page(request, exc.slug, exc.detail)
            except RequestValidationError as exc:
                first: dict[str, Any] = next(iter(exc.errors()), {})
                where = ".".join(str(p) for p in first.get("loc", ()) if p != "query")
                return _error_page(request, "validation-failed", f"{where}: {first.get('msg', 'invalid')}")
            except StarletteHTTPException as exc:
                return _error_page(request, "not-found", str(exc.detail), exc.status_code)

        return route


def _filters_query(**params: Any) -> str:
    """The filters as a query string for the fragment (empty ones left out)."""
    return urlencode({k: v for k, v in params.items() if v not in (None, "")})


def console_router(ctx: ApiContext) -> APIRouter:
    pages = APIRouter(route_class=HtmlErrorRoute)
    fragments = ctx.guarded()

    # --- pages (shells, no data) ------------------------------------------------------------

    @pages.get("/ui")
    async def home() -> Response:
        return RedirectResponse("/ui/runs", status_code=303)

    @pages.get("/ui/static/{name}")
    async def static(name: str) -> Response:
        found = static_file(name)
        if found is None:
            raise ApiProblem("not-found", f"no console file {name[:80]!r}")
        return found

    @pages.get("/ui/runs")
    async def runs_page(
        status: _Status = None,
        tenant: _Text = None,
        label: _Text = None,
        since: _Instant = None,
        until: _Instant = None,
        q: _Text = None,
        limit: _Limit = None,
        cursor: _Cursor = None,
    ) -> Response:
        data.run_query(status, tenant, label, since, until, q, limit, cursor)  # refused here, as HTML
        given = {
            "status": status,
            "tenant": tenant,
            "label": label,
            "since": since,
            "until": until,
            "q": q,
        }
        query = _filters_query(**given, limit=limit, cursor=cursor)
        return html(
            "runs.html",
            section="runs",
            filters={k: v or "" for k, v in given.items()},
            statuses=STATUS_VALUES,
            src=f"/ui/fragments/runs?{query}" if query else "/ui/fragments/runs",
            poll_ms=POLL_MS,
        )

    @pages.get("/ui/runs/{run_id}")
    async def run_page(run_id: str) -> Response:
        return _run_shell(run_id, "timeline")

    def _run_shell(run_id: str, tab: str) -> Response:
        return html("run.html", section="runs", run_id=run_id, tab=tab, tabs=RUN_TABS, poll_ms=POLL_MS)

    for tab in RUN_TABS:

        def tab_page(tab: str = tab) -> Callable[[str], Coroutine[Any, Any, Response]]:
            async def page(run_id: str) -> Response:
                return _run_shell(run_id, tab)

            page.__name__ = f"run_{tab}_page"
            return page

        pages.add_api_route(f"/ui/runs/{{run_id}}/{tab}", tab_page(), methods=["GET"])

    for name in ("incidents", "breakers", "schedules"):

        def board_page(name: str = name) -> Callable[[], Coroutine[Any, Any, Response]]:
            async def page() -> Response:
                return html("board.html", section=name, src=f"/ui/fragments/{name}", poll_ms=POLL_MS)

            page.__name__ = f"{name}_page"
            return page

        pages.add_api_route(f"/ui/{name}", board_page(), methods=["GET"])

    # --- fragments (the data, authenticated) ------------------------------------------------

    def fragment(template: str, **context: Any) -> HTMLResponse:
        return html(f"fragments/{template}", **context)

    @fragments.get("/ui/fragments/whoami")
    async def whoami(request: Request) -> Response:
        who = ctx.principal(request)
        return fragment("whoami.html", who=who, development=ctx.development_mode)

    @fragments.get("/ui/fragments/runs")
    async def runs_fragment(
        status: _Status = None,
        tenant: _Text = None,
        label: _Text = None,
        since: _Instant = None,
        until: _Instant = None,
        q: _Text = None,
        limit: _Limit = None,
        cursor: _Cursor = None,
    ) -> Response:
        query = data.run_query(status, tenant, label, since, until, q, limit, cursor)
        listing = await data.find_runs(ctx, query)
        given = {"status": status, "tenant": tenant, "label": label, "since": since, "until": until, "q": q}
        more = (
            f"/ui/runs?{_filters_query(**given, limit=limit, cursor=listing.next_cursor)}"
            if listing.next_cursor
            else None
        )
        return fragment("runs.html", listing=listing, more=more, query=query, max_scan=data.MAX_SCAN)

    @fragments.get("/ui/fragments/runs/{run_id}/summary")
    async def summary_fragment(run_id: str) -> Response:
        return fragment("summary.html", run=await data.existing_run(ctx, run_id))

    @fragments.get("/ui/fragments/runs/{run_id}/timeline")
    async def timeline_fragment(
        run_id: str, limit: Annotated[int, Query(ge=1, le=MAX_TIMELINE)] = DEFAULT_TIMELINE
    ) -> Response:
        run = await data.existing_run(ctx, run_id)
        history = list(run["history"])
        shown = list(reversed(history[-limit:]))  # newest first: a live change appears on top
        return fragment("timeline.html", run=run, events=shown, total=len(history))

    @fragments.get("/ui/fragments/runs/{run_id}/lease")
    async def lease_fragment(run_id: str) -> Response:
        run = await data.existing_run(ctx, run_id)
        leases = [run["lease"], *reversed(run.get("leaseHistory") or [])] if run.get("lease") else []
        return fragment("lease.html", run=run, leases=leases)

    @fragments.get("/ui/fragments/runs/{run_id}/trajectory")
    async def trajectory_fragment(run_id: str) -> Response:
        await data.existing_run(ctx, run_id)
        return fragment("trajectory.html", run_id=run_id, t=await data.trajectory(ctx, run_id))

    @fragments.get("/ui/fragments/runs/{run_id}/watchdog")
    async def watchdog_fragment(run_id: str) -> Response:
        await data.existing_run(ctx, run_id)
        return fragment("watchdog.html", run_id=run_id, w=await data.watchdog(ctx, run_id))

    @fragments.get("/ui/fragments/runs/{run_id}/quarantine")
    async def quarantine_fragment(run_id: str) -> Response:
        await data.existing_run(ctx, run_id)
        return fragment("quarantine.html", run_id=run_id, qv=await data.quarantine(ctx, run_id))

    @fragments.get("/ui/fragments/breakers")
    async def breakers_fragment() -> Response:
        return fragment("breakers.html", breakers=data.breakers(ctx))

    @fragments.get("/ui/fragments/schedules")
    async def schedules_fragment() -> Response:
        return fragment("schedules.html", schedules=await data.schedules(ctx))

    @fragments.get("/ui/fragments/incidents")
    async def incidents_fragment(request: Request) -> Response:
        who = ctx.principal(request)
        may_resolve = who.role == Role.OPERATOR
        found = await data.incidents(ctx)
        return fragment("incidents.html", incidents=found, who=who, may_resolve=may_resolve)

    router = APIRouter(include_in_schema=False)
    router.include_router(pages)
    router.include_router(fragments)
    return router
