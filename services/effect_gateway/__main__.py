"""`python -m services.effect_gateway`: the effect gateway (127.0.0.1:8200 by default).

Settings (TenureSettings): TENURE_GATEWAY_PORT, TENURE_TOOLS, TENURE_TOOL_TIMEOUT_S,
TENURE_API_KEYS (empty: development mode, said at start-up and in /healthz), the bulkheads
(TENURE_BULKHEAD_*: the pools, and the size of the HTTP connection pool to the tools) and
TENURE_BREAKER_SLOW_CALL_MS (the breakers themselves run in `python -m services.breakers`).
"""

from __future__ import annotations

from services.common.auth import parse_api_keys
from services.common.bulkhead import Bulkheads
from services.common.http_serve import serve_http
from services.common.logs import configure_logging
from services.common.settings import TenureSettings
from services.effect_gateway.app import create_app
from services.effect_gateway.service import Gateway
from services.effect_gateway.tools import ToolRegistry


def main() -> None:
    settings = TenureSettings()
    configure_logging(settings.log_level, service="tenure-effect-gateway")
    bootstrap = settings.bootstrap_servers()
    bulkheads = Bulkheads.from_settings(settings)  # bad limits stop it before anything starts
    app = create_app(
        lambda: Gateway(
            bootstrap,
            ToolRegistry.from_settings(settings, bulkheads),
            settings.decision_timeout_s,
            settings=settings,
            bulkheads=bulkheads,
        ),
        api_keys=parse_api_keys(settings.api_keys),
        max_body_bytes=settings.max_body_bytes,
    )
    serve_http(app, settings.api_host, settings.gateway_port, settings)


if __name__ == "__main__":
    main()
