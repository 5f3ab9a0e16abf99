"""FastAPI application: translates HTTP into Run commands and serves Run views.

A command is published to runs.commands and the request waits (bounded by
TENURE_DECISION_TIMEOUT_S) for its decision: the event it caused (and, for most routes, the Run
view showing it) or a rejection (409 and friends). If neither arrives in time the answer is 202
with the command id and a Location to poll; the command is durable on Kafka and will still be
decided.
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import AsyncIterator, Callable

from fastapi import FastAPI

from services.command_api.context import ApiContext, ApiDependencies, open_dependencies
from services.command_api.problems import register_problem_handlers
from services.command_api.routes_admin import admin_router
from services.command_api.routes_leases import leases_router
from services.command_api.routes_runs import runs_router
from services.command_api.routes_trajectories import trajectories_router
from services.command_api.routes_work import work_router

__all__ = ["ApiDependencies", "create_app", "open_dependencies"]


def create_app(open_deps: Callable[[], ApiDependencies]) -> FastAPI:
    ctx = ApiContext()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        ctx.open(await asyncio.to_thread(open_deps))
        try:
            yield
        finally:
            await asyncio.to_thread(ctx.close)

    app = FastAPI(
        title="Tenure command API",
        version="0.2.0",
        description="Submit, claim, renew, report, take over and inspect agent runs; drive a "
        "run's trajectory (saga) step by step and resolve its incidents. "
        "Errors are RFC 9457 problem+json.",
        lifespan=lifespan,
    )
    register_problem_handlers(app)
    app.include_router(runs_router(ctx))
    app.include_router(leases_router(ctx))
    app.include_router(work_router(ctx))
    app.include_router(trajectories_router(ctx))
    app.include_router(admin_router(ctx))
    return app
