"""`python -m services.effect_gateway`: the effect gateway (127.0.0.1:8200 by default)."""

from __future__ import annotations

import os

import uvicorn

from services.common.logs import configure_logging
from services.common.settings import TenureSettings
from services.effect_gateway.app import create_app
from services.effect_gateway.service import Gateway
from services.effect_gateway.tools import ToolRegistry


def main() -> None:
    settings = TenureSettings()
    configure_logging(settings.log_level, service="tenure-effect-gateway")
    bootstrap = settings.bootstrap_servers()
    app = create_app(lambda: Gateway(bootstrap, ToolRegistry.from_env(), settings.decision_timeout_s))
    port = int(os.environ.get("TENURE_GATEWAY_PORT", "8200"))
    uvicorn.run(app, host=settings.api_host, port=port, log_level="warning")


if __name__ == "__main__":
    main()
