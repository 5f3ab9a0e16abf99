"""`python -m services.sim_environment`: serve the simulated environment with uvicorn.

Settings (services/common/settings.py): TENURE_SIM_HOST (default 127.0.0.1; 0.0.0.0 inside a
container), TENURE_SIM_PORT (default 9200), TENURE_SIM_TIME_SCALE (default 0: answer at once;
1.0: every operation takes its nominal duration, e.g. a 4.2 s sandbox compile). Its state lives
in memory: a restart (or ``POST /reset``) starts from an empty world.
"""

from __future__ import annotations

from services.common.http_serve import serve_http
from services.common.logs import configure_logging
from services.common.settings import TenureSettings
from services.sim_environment.app import create_app

__all__ = ["main"]


def main() -> None:
    settings = TenureSettings()
    app = create_app(time_scale=settings.sim_time_scale)
    configure_logging(settings.log_level, service="tenure-sim-environment")
    serve_http(app, settings.sim_host, settings.sim_port, settings)


if __name__ == "__main__":
    main()
