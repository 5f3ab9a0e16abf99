"""The arithmetic bench/step_floor.py prints from its floors (issue 11).

The floors themselves are measured on a real broker by the script; what is checked here is that
the report turns them into the per-workflow cost and the ceiling the docs quote: transactions
times the broker's cost of one, plus seven requests at the server's and the client's cost.
"""

from __future__ import annotations

import argparse

import pytest

from bench.step_floor import (
    CORES,
    DBOS_1STEP_PER_S,
    REQUESTS_PER_1STEP,
    TRANSACTIONS_TODAY,
    AppendLatency,
    HttpFloor,
    TxnFloor,
    report,
)

ARGS = argparse.Namespace(readers=4, clients=8, group=8)


def _row(text: str, design: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith(f"| {design}"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_the_ceilings_follow_from_the_floors() -> None:
    floors = [
        TxnFloor("1 record", 1, 95.0, 2.0, 4_000),
        TxnFloor("8 records on one partition", 8, 11.9, 2.4, 4_000),
        TxnFloor("8 records over 4 partitions", 8, 11.9, 3.6, 4_000),
    ]
    http = HttpFloor(10_000.0, 0.1, 0.1)
    text = report(floors, http, ARGS)

    today = _row(text, "today's step path")
    cost_today = TRANSACTIONS_TODAY * 2.0 + REQUESTS_PER_1STEP * 0.2
    assert today[1] == "11"
    assert today[2] == f"{cost_today:.1f} ms"
    assert today[3] == f"{1000 * CORES / cost_today:.0f}"
    assert float(today[4]) == pytest.approx(1000 * CORES / cost_today / DBOS_1STEP_PER_S, abs=0.005)

    owner = _row(text, "one owner per partition")
    cost_owner = REQUESTS_PER_1STEP / 8 * 2.4 + REQUESTS_PER_1STEP * 0.2
    assert owner[1] == "0.875"
    assert owner[2] == f"{cost_owner:.1f} ms"
    assert owner[3] == f"{1000 * CORES / cost_owner:.0f}"


def test_a_record_costs_its_share_of_the_transaction() -> None:
    assert TxnFloor("8 records", 8, 10.0, 2.4, 0).broker_ms_per_record == pytest.approx(0.3)
    text = report(
        [TxnFloor("1 record", 1, 95.0, 2.0, 0), TxnFloor("8 on one", 8, 12.0, 2.4, 0)],
        HttpFloor(1.0, 0.09, 0.08),
        ARGS,
    )
    assert "| broker, one transaction of 8 on one | 2.40 ms (0.30 a record) |" in text
    assert "| HTTP request, server (FastAPI + uvicorn, no work) | 0.090 ms |" in text


def test_the_latency_of_one_durable_record_is_reported_when_measured() -> None:
    floors = [TxnFloor("1 record", 1, 95.0, 2.0, 0), TxnFloor("8 on one", 8, 12.0, 2.4, 0)]
    http = HttpFloor(1.0, 0.09, 0.08)
    assert "One record made durable" not in report(floors, http, ARGS)
    text = report(floors, http, ARGS, AppendLatency(0.68, 1.55, 3.3, 8.51))
    append = next(line for line in text.splitlines() if line.startswith("| an idempotent"))
    transaction = next(line for line in text.splitlines() if line.startswith("| a transaction of one record"))
    assert append.endswith("| 0.68 ms | 1.55 ms |")
    assert transaction.endswith("| 3.30 ms | 8.51 ms |")
