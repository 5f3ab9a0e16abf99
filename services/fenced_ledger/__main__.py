"""`python -m services.fenced_ledger`: serve the ledger with uvicorn on 127.0.0.1.

Environment: TENURE_LEDGER_PORT (default 9100), TENURE_LEDGER_DB (default
``<TENURE_STATE_DIR or <repo>/.tenure>/fenced_ledger.sqlite3``), TENURE_LEDGER_FAULTS=1 to
enable the ``/faults`` test routes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import uvicorn

from services.fenced_ledger.app import create_app
from services.fenced_ledger.store import LedgerStore

__all__ = ["DEFAULT_PORT", "HOST", "database_path", "faults_enabled", "listen_port", "main"]

HOST = "127.0.0.1"
DEFAULT_PORT = 9100
# Same default state directory as the rest of Tenure (services/common/settings.py), computed
# here so the ledger stays independent of Tenure's code.
REPO_ROOT = Path(__file__).resolve().parents[2]


class LedgerConfigError(ValueError):
    """An environment variable has a value the ledger cannot use."""


def listen_port(env: Mapping[str, str]) -> int:
    raw = env.get("TENURE_LEDGER_PORT", "").strip()
    if not raw:
        return DEFAULT_PORT
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise LedgerConfigError(f"TENURE_LEDGER_PORT must be a TCP port (1-65535), got {raw!r}")
    return int(raw)


def database_path(env: Mapping[str, str]) -> Path:
    configured = env.get("TENURE_LEDGER_DB", "").strip()
    if configured:
        return Path(configured)
    state_dir = env.get("TENURE_STATE_DIR", "").strip()
    return (Path(state_dir) if state_dir else REPO_ROOT / ".tenure") / "fenced_ledger.sqlite3"


def faults_enabled(env: Mapping[str, str]) -> bool:
    return env.get("TENURE_LEDGER_FAULTS", "").strip() == "1"


def main() -> None:
    env = dict(os.environ)
    store = LedgerStore(database_path(env))
    store.initialize()
    app = create_app(store, faults_enabled=faults_enabled(env))
    # Loopback unless told otherwise (TENURE_LEDGER_HOST=0.0.0.0 inside a container).
    host = env.get("TENURE_LEDGER_HOST", "").strip() or HOST
    uvicorn.run(app, host=host, port=listen_port(env), log_level="warning")


if __name__ == "__main__":
    main()
