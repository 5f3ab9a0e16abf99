"""`python -m services.command_api`: serve the API with uvicorn (127.0.0.1:8000 by default)."""

from __future__ import annotations

import uvicorn

from services.command_api.app import create_app, open_dependencies
from services.common.logs import configure_logging
from services.common.settings import TenureSettings
from services.projections.service import views_path


def main() -> None:
    settings = TenureSettings()
    configure_logging(settings.log_level, service="tenure-command-api")
    bootstrap = settings.bootstrap_servers()
    app = create_app(
        lambda: open_dependencies(
            bootstrap,
            views_path(settings.state_dir),
            settings.decision_timeout_s,
            settings.state_dir / "artifacts",
        ),
        max_body_bytes=settings.max_body_bytes,
    )
    # uvloop and httptools: the fastest loop and parser uvicorn has (issue 11, per-request CPU).
    uvicorn.run(
        app,
        host=settings.api_host,
        port=settings.api_port,
        log_level="warning",
        loop="uvloop",
        http="httptools",
    )


if __name__ == "__main__":
    main()
