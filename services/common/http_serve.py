"""The one way Tenure's HTTP processes serve: uvicorn with uvloop and httptools (the fastest loop
and parser it has; issue 11, per-request CPU), its logs as JSON through the process's own
formatter, and its access log only when TENURE_ACCESS_LOG asks for it."""

from __future__ import annotations

from typing import Any

import uvicorn

from services.common.logs import uvicorn_log_config
from services.common.settings import TenureSettings

__all__ = ["serve_http"]


def serve_http(app: Any, host: str, port: int, settings: TenureSettings) -> None:
    """Serve `app` until the process is told to stop (uvicorn handles SIGTERM and SIGINT)."""
    uvicorn.run(
        app,
        host=host,
        port=port,
        # The levels are the log config's (uvicorn at WARNING, its access log at INFO when on):
        # uvicorn's own log_level would set the access logger to it too and silence it.
        log_config=uvicorn_log_config(),
        log_level=None,
        access_log=settings.access_log,
        loop="uvloop",
        http="httptools",
    )
