"""`python -m services.command_api`: serve the API with uvicorn (127.0.0.1:8000 by default)."""

from __future__ import annotations

from services.command_api.app import create_app, open_dependencies
from services.command_api.projection import api_views_path
from services.common.http_serve import serve_http
from services.common.logs import configure_logging
from services.common.settings import TenureSettings


def main() -> None:
    settings = TenureSettings()
    configure_logging(settings.log_level, service="tenure-command-api")
    bootstrap = settings.bootstrap_servers()
    app = create_app(
        lambda: open_dependencies(
            bootstrap,
            api_views_path(settings.state_dir, settings.instance_id),
            settings.decision_timeout_s,
            settings.state_dir / "artifacts",
        ),
        max_body_bytes=settings.max_body_bytes,
    )
    serve_http(app, settings.api_host, settings.api_port, settings)


if __name__ == "__main__":
    main()
