"""`python -m services.fenced_ledger`: serve the ledger with uvicorn on 127.0.0.1.

Settings (services/common/settings.py): TENURE_LEDGER_PORT (default 9100), TENURE_LEDGER_HOST,
TENURE_LEDGER_DB (default ``<TENURE_STATE_DIR>/fenced_ledger.sqlite3``), TENURE_LEDGER_FAULTS=1 to
enable the ``/faults`` test routes.
"""

from __future__ import annotations

from services.common.http_serve import serve_http
from services.common.logs import configure_logging
from services.common.settings import TenureSettings
from services.fenced_ledger.app import create_app
from services.fenced_ledger.store import LedgerStore

__all__ = ["main"]


def main() -> None:
    settings = TenureSettings()
    store = LedgerStore(settings.ledger_database())
    store.initialize()
    app = create_app(store, faults_enabled=settings.ledger_faults)
    configure_logging(settings.log_level, service="tenure-fenced-ledger")
    serve_http(app, settings.ledger_host, settings.ledger_port, settings)


if __name__ == "__main__":
    main()
