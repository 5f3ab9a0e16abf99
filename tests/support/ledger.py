"""A fenced ledger on a fresh SQLite file, for the ledger's tests."""

from __future__ import annotations

from pathlib import Path

from services.fenced_ledger.store import LedgerStore

__all__ = ["ledger_store"]


def ledger_store(tmp_path: Path) -> LedgerStore:
    ledger = LedgerStore(tmp_path / "ledger.sqlite3")
    ledger.initialize()
    return ledger
