"""The fenced ledger: Tenure's reference recipient of external effects.

Proves that fencing is checked by the *recipient* (LEASE-3: a previous holder's epoch is refused
and changes nothing), that a repeated effect is never applied twice (EXE-6: idempotency keys),
and that "did it happen?" can be asked after a lost acknowledgement (REC-6: the probe finds an
effect that committed although its caller timed out). Covers the pure core, the SQLite store
(including concurrent writers on one file); the HTTP app is in
test_fenced_ledger_http.py.
"""

from __future__ import annotations

import sqlite3
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from services.common.settings import TenureSettings
from services.fenced_ledger.ledger import (
    INT64_MAX,
    Apply,
    BalanceOverflow,
    EffectRequest,
    InsufficientFunds,
    InvalidEffectRequest,
    KeyConflict,
    Replay,
    StaleEpoch,
    build_effect_request,
    canonical_json,
    decide,
    record_effect,
)
from services.fenced_ledger.store import LedgerStore
from tests.support.ledger import ledger_store

pytestmark = pytest.mark.timeout(30)


# --------------------------------------------------------------------------- pure core


def _request(
    key: str = "k1",
    work: str = "run-1",
    epoch: int = 1,
    operation: str = "credit",
    payload: dict[str, Any] | None = None,
) -> EffectRequest:
    body = {
        "operation": operation,
        "payload": payload if payload is not None else {"account": "a", "amount": 10},
    }
    return build_effect_request(key, work, str(epoch), body)


def _stored(request: EffectRequest, balance: int | None = 10) -> Any:
    account = request.account
    return record_effect(request, Apply(request.epoch, account, balance), "eff_1", "2026-01-01T00:00:00.000Z")


def test_core_first_effect_applies_and_sets_the_bar() -> None:
    decision = decide(_request(epoch=4), existing=None, highest_epoch=None, balance=0)
    assert decision == Apply(raise_epoch_to=4, account="a", new_balance=10)


def test_core_stale_epoch_is_refused_LEASE_3() -> None:
    decision = decide(_request(epoch=2), existing=None, highest_epoch=3, balance=50)
    assert decision == StaleEpoch(work_id="run-1", presented_epoch=2, highest_epoch=3)


def test_core_equal_epoch_applies_without_raising_the_bar() -> None:
    decision = decide(_request(epoch=3), existing=None, highest_epoch=3, balance=5)
    assert decision == Apply(raise_epoch_to=None, account="a", new_balance=15)


def test_core_higher_epoch_raises_the_bar_LEASE_3() -> None:
    decision = decide(_request(epoch=9, operation="debit"), existing=None, highest_epoch=3, balance=25)
    assert decision == Apply(raise_epoch_to=9, account="a", new_balance=15)


def test_core_note_touches_no_account() -> None:
    decision = decide(_request(operation="note", payload={"text": "hi", "n": [1, 2]}), None, None)
    assert decision == Apply(raise_epoch_to=1, account=None, new_balance=None)


def test_core_same_request_under_known_key_replays_EXE_6() -> None:
    original = _request(epoch=1)
    stored = _stored(original)
    # A retry is recognised whatever epoch it carries, even one now below the bar: the effect
    # happened, so the answer is its result, never a second application (REC-6).
    for retry_epoch, highest in ((1, 1), (5, 1), (1, 7)):
        decision = decide(_request(epoch=retry_epoch), stored, highest, balance=999)
        assert decision == Replay(stored)


def test_core_payload_key_order_does_not_make_a_different_request() -> None:
    stored = _stored(_request(payload={"account": "a", "amount": 10}))
    reordered = build_effect_request(
        "k1", "run-1", "1", {"payload": {"amount": 10, "account": "a"}, "operation": "credit"}
    )
    assert decide(reordered, stored, 1) == Replay(stored)


@pytest.mark.parametrize(
    ("changes", "differences"),
    [
        ({"work": "run-2"}, ("workId",)),
        ({"operation": "debit"}, ("operation",)),
        ({"payload": {"account": "a", "amount": 11}}, ("payload",)),
        ({"work": "run-2", "operation": "note", "payload": {}}, ("workId", "operation", "payload")),
    ],
)
def test_core_different_request_under_known_key_conflicts(
    changes: dict[str, Any], differences: tuple[str, ...]
) -> None:
    stored = _stored(_request())
    decision = decide(_request(**changes), stored, 1)
    assert decision == KeyConflict(stored, differences)


def test_core_debit_below_zero_is_refused_but_still_raises_the_bar() -> None:
    decision = decide(
        _request(epoch=6, operation="debit", payload={"account": "a", "amount": 8}), None, 5, balance=7
    )
    assert decision == InsufficientFunds(account="a", balance=7, amount=8, raise_epoch_to=6)


def test_core_credit_past_int64_is_refused() -> None:
    decision = decide(_request(payload={"account": "a", "amount": 10}), None, None, balance=INT64_MAX - 5)
    assert decision == BalanceOverflow(account="a", balance=INT64_MAX - 5, amount=10, raise_epoch_to=1)


def test_core_recorded_result_is_what_replays_answer() -> None:
    request = _request(key="k9", work="run-7", epoch=3, payload={"account": "acc", "amount": 4})
    effect = record_effect(request, Apply(3, "acc", 4), "eff_x", "2026-01-01T00:00:00.000Z")
    assert effect.result == {
        "effectId": "eff_x",
        "idempotencyKey": "k9",
        "workId": "run-7",
        "epoch": 3,
        "operation": "credit",
        "payload": {"account": "acc", "amount": 4},
        "account": "acc",
        "balance": 4,
        "appliedAt": "2026-01-01T00:00:00.000Z",
    }


@pytest.mark.parametrize(
    ("key", "work", "epoch", "problem"),
    [
        (None, "run-1", "1", "idempotency-key-required"),
        ("", "run-1", "1", "idempotency-key-required"),
        (" k", "run-1", "1", "idempotency-key-required"),
        ("k" * 256, "run-1", "1", "idempotency-key-required"),
        ("k", None, "1", "work-id-required"),
        ("k", "   ", "1", "work-id-required"),
        ("k", "run-1", None, "fencing-epoch-required"),
        ("k", "run-1", "", "fencing-epoch-required"),
        ("k", "run-1", "-1", "fencing-epoch-invalid"),
        ("k", "run-1", "+1", "fencing-epoch-invalid"),
        ("k", "run-1", "5_0", "fencing-epoch-invalid"),
        ("k", "run-1", " 5", "fencing-epoch-invalid"),
        ("k", "run-1", "1.5", "fencing-epoch-invalid"),
        ("k", "run-1", str(INT64_MAX + 1), "fencing-epoch-invalid"),
    ],
)
def test_core_rejects_bad_headers(key: str | None, work: str | None, epoch: str | None, problem: str) -> None:
    with pytest.raises(InvalidEffectRequest) as caught:
        build_effect_request(key, work, epoch, {"operation": "note", "payload": {}})
    assert caught.value.problem == problem


def test_core_accepts_the_largest_epoch() -> None:
    assert (
        build_effect_request("k", "w", str(INT64_MAX), {"operation": "note", "payload": {}}).epoch
        == INT64_MAX
    )


@pytest.mark.parametrize(
    "body",
    [
        None,
        [],
        "credit",
        {"operation": "credit"},
        {"operation": "transfer", "payload": {}},
        {"operation": "credit", "payload": []},
        {"operation": "credit", "payload": {"account": "a"}},
        {"operation": "credit", "payload": {"account": "a", "amount": 0}},
        {"operation": "credit", "payload": {"account": "a", "amount": -3}},
        {"operation": "credit", "payload": {"account": "a", "amount": 1.5}},
        {"operation": "credit", "payload": {"account": "a", "amount": True}},
        {"operation": "credit", "payload": {"account": "a", "amount": 10**12 + 1}},
        {"operation": "debit", "payload": {"account": "", "amount": 1}},
        {"operation": "debit", "payload": {"account": 7, "amount": 1}},
        {"operation": "debit", "payload": {"account": "a", "amount": 1, "memo": "x"}},
        {"operation": "note", "payload": {"x": float("nan")}},
        {"operation": "note", "payload": {}, "extra": 1},
    ],
)
def test_core_rejects_bad_bodies(body: Any) -> None:
    with pytest.raises(InvalidEffectRequest) as caught:
        build_effect_request("k", "run-1", "1", body)
    assert caught.value.problem == "invalid-effect"


def test_canonical_json_is_key_order_independent() -> None:
    assert canonical_json({"b": 1, "a": [1, {"d": 2, "c": 3}]}) == canonical_json(
        {"a": [1, {"c": 3, "d": 2}], "b": 1}
    )


# --------------------------------------------------------------------------- store


# A fresh ledger file per test.
store = pytest.fixture(name="store")(ledger_store)


def test_store_uses_one_sqlite_file_in_wal_mode(store: LedgerStore) -> None:
    store.submit(_request())
    with sqlite3.connect(store.path) as connection:
        assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.path.is_file()


def test_store_initialize_is_idempotent_and_keeps_data(store: LedgerStore) -> None:
    store.submit(_request(epoch=3))
    store.initialize()
    reopened = LedgerStore(store.path)
    reopened.initialize()
    work = reopened.work("run-1")
    assert work is not None
    assert work.highest_epoch == 3
    assert [e.idempotency_key for e in work.effects] == ["k1"]


def test_store_stale_epoch_changes_nothing_LEASE_3(store: LedgerStore) -> None:
    store.submit(_request(key="k1", epoch=5, payload={"account": "a", "amount": 100}))
    outcome = store.submit(
        _request(key="k2", epoch=4, operation="debit", payload={"account": "a", "amount": 60})
    )
    assert outcome.decision == StaleEpoch("run-1", 4, 5)
    assert outcome.effect is None
    assert store.find_effect("k2") is None
    assert store.balance("a") == 100
    work = store.work("run-1")
    assert work is not None
    assert (work.highest_epoch, len(work.effects)) == (5, 1)


def test_store_insufficient_funds_applies_nothing_but_fences_the_old_holder(store: LedgerStore) -> None:
    store.submit(_request(key="k1", epoch=1, payload={"account": "a", "amount": 5}))
    refused = store.submit(
        _request(key="k2", epoch=2, operation="debit", payload={"account": "a", "amount": 6})
    )
    assert isinstance(refused.decision, InsufficientFunds)
    assert store.find_effect("k2") is None
    assert store.balance("a") == 5
    # The newer holder showed up with epoch 2, so the epoch-1 holder is out from now on.
    assert isinstance(store.submit(_request(key="k3", epoch=1)).decision, StaleEpoch)
    work = store.work("run-1")
    assert work is not None
    assert work.highest_epoch == 2


def test_store_fences_each_work_id_independently(store: LedgerStore) -> None:
    store.submit(_request(key="k1", work="run-1", epoch=9))
    outcome = store.submit(_request(key="k2", work="run-2", epoch=1))
    assert isinstance(outcome.decision, Apply)
    assert store.balance("a") == 20


def test_store_concurrent_writers_on_one_file_apply_a_key_exactly_once_EXE_6(tmp_path: Path) -> None:
    path = tmp_path / "shared.sqlite3"
    LedgerStore(path).initialize()
    # One store object per thread, each on its own connection: the same situation as several
    # server processes on the file. Only SQLite's write lock serialises them.
    stores = [LedgerStore(path) for _ in range(8)]
    barrier = threading.Barrier(len(stores))

    def submit(ledger: LedgerStore) -> object:
        barrier.wait()
        return ledger.submit(_request(key="same", payload={"account": "a", "amount": 7})).decision

    with ThreadPoolExecutor(max_workers=len(stores)) as pool:
        decisions = list(pool.map(submit, stores))
    assert sum(isinstance(d, Apply) for d in decisions) == 1
    assert sum(isinstance(d, Replay) for d in decisions) == 7
    assert stores[0].balance("a") == 7


def test_store_concurrent_debits_never_overdraw(store: LedgerStore) -> None:
    store.submit(_request(key="fund", payload={"account": "a", "amount": 50}))
    barrier = threading.Barrier(8)

    def debit(index: int) -> object:
        barrier.wait()
        request = _request(key=f"d{index}", operation="debit", payload={"account": "a", "amount": 15})
        return LedgerStore(store.path).submit(request).decision

    with ThreadPoolExecutor(max_workers=8) as pool:
        decisions = list(pool.map(debit, range(8)))
    assert sum(isinstance(d, Apply) for d in decisions) == 3
    assert sum(isinstance(d, InsufficientFunds) for d in decisions) == 5
    assert store.balance("a") == 5


# A reference model written out plainly, to compare the store against over random histories.
_STEPS = st.lists(
    st.tuples(
        st.sampled_from(["k1", "k2", "k3", "k4", "k5", "k6"]),
        st.sampled_from(["w1", "w2"]),
        st.integers(min_value=0, max_value=4),
        st.sampled_from(["credit", "debit", "note"]),
        st.integers(min_value=1, max_value=20),
    ),
    max_size=14,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=_STEPS)
def test_store_matches_a_reference_model_LEASE_3_EXE_6(steps: list[tuple[str, str, int, str, int]]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        ledger = LedgerStore(Path(folder) / "model.sqlite3")
        ledger.initialize()
        highest: dict[str, int] = {}
        applied: dict[str, tuple[str, str, str]] = {}
        balance = 0
        for key, work, epoch, operation, amount in steps:
            payload: dict[str, Any] = (
                {"account": "acc", "amount": amount} if operation != "note" else {"n": amount}
            )
            request = build_effect_request(
                key, work, str(epoch), {"operation": operation, "payload": payload}
            )
            identity = (work, operation, canonical_json(payload))
            if key in applied:
                expected: type = Replay if applied[key] == identity else KeyConflict
            elif epoch < highest.get(work, -1):
                expected = StaleEpoch
            else:
                highest[work] = max(epoch, highest.get(work, -1))
                change = {"credit": amount, "debit": -amount, "note": 0}[operation]
                if balance + change < 0:
                    expected = InsufficientFunds
                else:
                    expected, balance = Apply, balance + change
                    applied[key] = identity
            assert type(ledger.submit(request).decision) is expected
        assert (ledger.balance("acc") or 0) == balance
        for work, epoch in highest.items():
            record = ledger.work(work)
            assert record is not None
            assert record.highest_epoch == epoch
            assert {e.idempotency_key for e in record.effects} == {
                k for k, identity in applied.items() if identity[0] == work
            }


# --------------------------------------------------------------------------- configuration


def test_main_reads_port_db_and_faults_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("TENURE_LEDGER_PORT", "TENURE_LEDGER_DB", "TENURE_STATE_DIR", "TENURE_LEDGER_FAULTS"):
        monkeypatch.delenv(name, raising=False)
    assert TenureSettings().ledger_port == 9100
    assert TenureSettings().ledger_database().parts[-2:] == (".tenure", "fenced_ledger.sqlite3")
    assert TenureSettings().ledger_faults is False
    monkeypatch.setenv("TENURE_LEDGER_PORT", "9201")
    assert TenureSettings().ledger_port == 9201
    monkeypatch.setenv("TENURE_LEDGER_PORT", "http")
    with pytest.raises(ValidationError, match="ledger_port"):
        TenureSettings()
    monkeypatch.delenv("TENURE_LEDGER_PORT")
    monkeypatch.setenv("TENURE_STATE_DIR", str(tmp_path))
    assert TenureSettings().ledger_database() == tmp_path / "fenced_ledger.sqlite3"
    monkeypatch.setenv("TENURE_LEDGER_DB", str(tmp_path / "x.db"))
    assert TenureSettings().ledger_database() == tmp_path / "x.db"
    monkeypatch.setenv("TENURE_LEDGER_FAULTS", "1")
    assert TenureSettings().ledger_faults is True
    monkeypatch.setenv("TENURE_LEDGER_FAULTS", "0")
    assert TenureSettings().ledger_faults is False
