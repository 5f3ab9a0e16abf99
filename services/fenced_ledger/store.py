"""The fenced ledger's durable state: one SQLite file in WAL mode, via the stdlib ``sqlite3``.

Every effect request is decided and written inside one ``BEGIN IMMEDIATE`` transaction, which
takes SQLite's write lock before the first read. That is what makes the epoch check and the
idempotency check hold under concurrency, across threads and across processes sharing the file:
two requests can never both read "key unknown" or "epoch is the highest" and then both write.
No Python lock is involved, on purpose, so the guarantee does not depend on there being a
single server process.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from services.fenced_ledger.ledger import (
    Apply,
    BalanceOverflow,
    Decision,
    EffectRequest,
    InsufficientFunds,
    StoredEffect,
    decide,
    record_effect,
)

__all__ = [
    "LedgerStore",
    "StorageUnavailable",
    "SubmitOutcome",
    "WorkRecord",
    "utc_timestamp",
]

SCHEMA_VERSION = 1

_SCHEMA = (
    """
    CREATE TABLE IF NOT EXISTS works (
        work_id       TEXT PRIMARY KEY,
        highest_epoch INTEGER NOT NULL
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS accounts (
        account TEXT PRIMARY KEY,
        balance INTEGER NOT NULL CHECK (balance >= 0)
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS effects (
        seq             INTEGER PRIMARY KEY AUTOINCREMENT,
        idempotency_key TEXT NOT NULL UNIQUE,
        effect_id       TEXT NOT NULL UNIQUE,
        work_id         TEXT NOT NULL,
        epoch           INTEGER NOT NULL,
        operation       TEXT NOT NULL,
        payload_json    TEXT NOT NULL,
        result_json     TEXT NOT NULL,
        applied_at      TEXT NOT NULL
    )
    """,
    "CREATE INDEX IF NOT EXISTS effects_by_work ON effects (work_id, seq)",
)

_EFFECT_COLUMNS = (
    "effect_id, idempotency_key, work_id, epoch, operation, payload_json, result_json, applied_at"
)


class StorageUnavailable(Exception):
    """SQLite could not run the transaction (e.g. the write lock stayed busy past the timeout)."""


def utc_timestamp() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _new_effect_id() -> str:
    return f"eff_{uuid.uuid4().hex}"


@dataclass(frozen=True)
class SubmitOutcome:
    """The decision taken for a request, and the effect it concerns (applied, replayed or
    conflicting); ``effect`` is None for refusals that stored nothing."""

    decision: Decision
    effect: StoredEffect | None


@dataclass(frozen=True)
class WorkRecord:
    work_id: str
    highest_epoch: int
    effects: tuple[StoredEffect, ...]


def _effect_from_row(row: tuple[str, str, str, int, str, str, str, str]) -> StoredEffect:
    return StoredEffect(*row)


class LedgerStore:
    """Opens a short-lived connection per call; SQLite connections are cheap and this keeps
    every thread (and every process) on its own connection without any sharing rules."""

    def __init__(
        self,
        path: Path | str,
        *,
        busy_timeout_s: float = 10.0,
        clock: Callable[[], str] = utc_timestamp,
        new_effect_id: Callable[[], str] = _new_effect_id,
    ) -> None:
        self.path = Path(path)
        self._busy_timeout_s = busy_timeout_s
        self._clock = clock
        self._new_effect_id = new_effect_id

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        try:
            # isolation_level=None: the module must not open transactions behind our back; we
            # issue BEGIN IMMEDIATE / COMMIT / ROLLBACK ourselves.
            connection = sqlite3.connect(
                self.path, timeout=self._busy_timeout_s, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise StorageUnavailable(f"cannot open ledger database {self.path}: {exc}") from exc
        try:
            # FULL: a commit is on disk before the caller hears 201, so an acknowledged effect
            # survives a crash of the process or of the machine (NORMAL in WAL only survives
            # a process crash).
            connection.execute("PRAGMA synchronous=FULL")
            yield connection
        except sqlite3.OperationalError as exc:
            raise StorageUnavailable(f"ledger database {self.path} is unavailable: {exc}") from exc
        finally:
            connection.close()

    def initialize(self) -> None:
        """Create the file and tables if needed and switch the file to WAL (persistent)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as connection:
            mode = connection.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StorageUnavailable(f"ledger database {self.path} refused WAL mode (got {mode!r})")
            connection.execute("BEGIN IMMEDIATE")
            try:
                for statement in _SCHEMA:
                    connection.execute(statement)
                connection.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
                connection.execute("COMMIT")
            except BaseException:
                connection.execute("ROLLBACK")
                raise

    def check(self) -> None:
        """Raise :class:`StorageUnavailable` unless the database answers a read."""
        with self._connect() as connection:
            connection.execute("SELECT count(*) FROM works").fetchone()

    def submit(self, request: EffectRequest) -> SubmitOutcome:
        """Decide and apply ``request`` atomically (see the module docstring)."""
        with self._connect() as connection:
            connection.execute("BEGIN IMMEDIATE")
            try:
                outcome = self._submit_locked(connection, request)
            except BaseException:
                connection.execute("ROLLBACK")
                raise
            if outcome.decision_writes:
                connection.execute("COMMIT")
            else:
                # Replays, conflicts and stale epochs change nothing: nothing to commit.
                connection.execute("ROLLBACK")
            return SubmitOutcome(outcome.decision, outcome.effect)

    def _submit_locked(self, connection: sqlite3.Connection, request: EffectRequest) -> _Pending:
        existing = self._effect(connection, request.idempotency_key)
        row = connection.execute(
            "SELECT highest_epoch FROM works WHERE work_id = ?", (request.work_id,)
        ).fetchone()
        highest = None if row is None else int(row[0])
        balance = 0
        if request.account is not None:
            found = connection.execute(
                "SELECT balance FROM accounts WHERE account = ?", (request.account,)
            ).fetchone()
            balance = 0 if found is None else int(found[0])
        decision = decide(request, existing, highest, balance)
        match decision:
            case Apply():
                self._raise_epoch(connection, request.work_id, decision.raise_epoch_to)
                if decision.account is not None and decision.new_balance is not None:
                    connection.execute(
                        "INSERT INTO accounts (account, balance) VALUES (?, ?) "
                        "ON CONFLICT (account) DO UPDATE SET balance = excluded.balance",
                        (decision.account, decision.new_balance),
                    )
                effect = record_effect(request, decision, self._new_effect_id(), self._clock())
                connection.execute(
                    f"INSERT INTO effects ({_EFFECT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        effect.effect_id,
                        effect.idempotency_key,
                        effect.work_id,
                        effect.epoch,
                        effect.operation,
                        effect.payload_json,
                        effect.result_json,
                        effect.applied_at,
                    ),
                )
                return _Pending(decision, effect, decision_writes=True)
            case InsufficientFunds() | BalanceOverflow():
                self._raise_epoch(connection, request.work_id, decision.raise_epoch_to)
                return _Pending(decision, None, decision_writes=decision.raise_epoch_to is not None)
            case _:
                return _Pending(decision, existing, decision_writes=False)

    @staticmethod
    def _raise_epoch(connection: sqlite3.Connection, work_id: str, epoch: int | None) -> None:
        if epoch is None:
            return
        # MAX() keeps the bar monotonic even if a caller ever passed a lower value by mistake.
        connection.execute(
            "INSERT INTO works (work_id, highest_epoch) VALUES (?, ?) "
            "ON CONFLICT (work_id) DO UPDATE SET highest_epoch = MAX(highest_epoch, excluded.highest_epoch)",
            (work_id, epoch),
        )

    @staticmethod
    def _effect(connection: sqlite3.Connection, idempotency_key: str) -> StoredEffect | None:
        row = connection.execute(
            f"SELECT {_EFFECT_COLUMNS} FROM effects WHERE idempotency_key = ?", (idempotency_key,)
        ).fetchone()
        return None if row is None else _effect_from_row(row)

    def find_effect(self, idempotency_key: str) -> StoredEffect | None:
        """The effect stored under ``idempotency_key``: the reconcile-before-retry probe."""
        with self._connect() as connection:
            return self._effect(connection, idempotency_key)

    def work(self, work_id: str) -> WorkRecord | None:
        """The work id's highest epoch and applied effects (oldest first); None if never seen."""
        with self._connect() as connection:
            # One read transaction, so the bar and the effect list belong to the same moment.
            connection.execute("BEGIN")
            try:
                row = connection.execute(
                    "SELECT highest_epoch FROM works WHERE work_id = ?", (work_id,)
                ).fetchone()
                rows = connection.execute(
                    f"SELECT {_EFFECT_COLUMNS} FROM effects WHERE work_id = ? ORDER BY seq", (work_id,)
                ).fetchall()
            finally:
                connection.execute("ROLLBACK")
        if row is None:
            return None
        return WorkRecord(work_id, int(row[0]), tuple(_effect_from_row(r) for r in rows))

    def balance(self, account: str) -> int | None:
        """The account's balance; None if no effect ever touched it."""
        with self._connect() as connection:
            row = connection.execute("SELECT balance FROM accounts WHERE account = ?", (account,)).fetchone()
        return None if row is None else int(row[0])


@dataclass(frozen=True)
class _Pending:
    decision: Decision
    effect: StoredEffect | None
    decision_writes: bool
