"""The stream runtime classifies what a batch handler raises (issue 10, BRK-3).

Before: every exception was retried five times (0.1 s doubling to 2 s, no jitter), then the
process exited; a fenced producer was retried like a lost connection. Now: a fenced writer ends
the process at once, without another attempt; a transient error (a retriable Kafka error, a
RocksDB I/O error, a timeout, a lost connection) is retried with the one capped full-jitter
backoff until it passes or its budget is spent; anything else ends the process at once. The
runtime never returns with a batch undone (faust would acknowledge it). Timer work backs off by
skipping ticks. The runtime's readiness says which check fails.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from services.common.kafka import WriterFenced
from services.common.streams import CommandStream, Failure, StreamSettings, classify_failure


class Exited(BaseException):
    """What the test's exit_process raises instead of ending pytest."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _exit(code: int) -> None:
    raise Exited(code)


def stream(
    tmp_path: Path,
    handler: Callable[[Any], object],
    *,
    restored: Callable[[], frozenset[int]] | None = None,
    budget_s: float = 60.0,
    sleeps: list[float] | None = None,
) -> CommandStream:
    settings = StreamSettings(
        app_id="tenure-test-runtime",
        bootstrap_servers="127.0.0.1:1",
        topic="runs.commands",
        partitions=4,
        instance_id="0",
        data_dir=tmp_path,
        retry_base_s=0.1,
        retry_cap_s=2.0,
        transient_budget_s=budget_s,
    )
    return CommandStream(
        settings,
        handler,
        on_revoked=lambda: None,
        on_assigned=lambda partitions: None,
        restored=restored,
        sleep=(sleeps.append if sleeps is not None else lambda s: None),
        exit_process=_exit,
    )


class Flaky:
    def __init__(self, *failures: BaseException) -> None:
        self.failures = list(failures)
        self.calls = 0

    def __call__(self, records: Any = None) -> None:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)


def kafka(code: int, *, retriable: bool = False, fatal: bool = False) -> KafkaException:
    return KafkaException(KafkaError(code, "test", fatal=fatal, retriable=retriable))


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (WriterFenced("producer fenced"), Failure.FENCED),
        (kafka(KafkaError._TRANSPORT), Failure.TRANSIENT),
        (kafka(KafkaError._ALL_BROKERS_DOWN), Failure.TRANSIENT),
        (kafka(KafkaError.REQUEST_TIMED_OUT), Failure.TRANSIENT),
        (kafka(KafkaError.UNKNOWN, retriable=True), Failure.TRANSIENT),
        (kafka(KafkaError.MSG_SIZE_TOO_LARGE), Failure.FATAL),
        (kafka(KafkaError._TRANSPORT, fatal=True), Failure.FATAL),
        (kafka(KafkaError._STATE), Failure.FATAL),
        (TimeoutError("restore read timed out"), Failure.TRANSIENT),
        (ConnectionError("simulated broker failure"), Failure.TRANSIENT),
        (Exception("IO error: No space left on device"), Failure.TRANSIENT),
        (Exception("Corruption: block checksum mismatch"), Failure.FATAL),
        (ValueError("a bug"), Failure.FATAL),
        (RuntimeError("wrapped"), Failure.FATAL),
    ],
)
def test_failures_are_classified(exc: BaseException, expected: Failure) -> None:
    assert classify_failure(exc) is expected


def test_an_explicit_cause_is_looked_through() -> None:
    try:
        try:
            raise kafka(KafkaError._TRANSPORT)
        except KafkaException as inner:
            raise RuntimeError("restore failed") from inner
    except RuntimeError as outer:
        assert classify_failure(outer) is Failure.TRANSIENT


def test_a_transient_failure_is_retried_with_capped_full_jitter_and_logged_once_per_change(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    handler = Flaky(*(ConnectionError("broker away") for _ in range(8)))
    sleeps: list[float] = []
    caplog.set_level(logging.INFO, logger="tenure.streams")
    stream(tmp_path, handler, sleeps=sleeps).handle_or_die([])
    assert handler.calls == 9, "retried until it passed; never returned with the batch undone"
    assert len(sleeps) == 8
    assert all(0 <= s <= min(2.0, 0.1 * 2**i) for i, s in enumerate(sleeps)), sleeps
    lines = [r.getMessage() for r in caplog.records if r.name == "tenure.streams"]
    assert len(lines) == 2, lines
    assert "failing transiently" in lines[0] and "recovered after 8 retries" in lines[1]


def test_a_fenced_writer_ends_the_process_without_another_attempt(tmp_path: Path) -> None:
    handler = Flaky(WriterFenced("fenced by a newer incarnation"))
    with pytest.raises(Exited) as exited:
        stream(tmp_path, handler).handle_or_die([])
    assert exited.value.code == 75
    assert handler.calls == 1


def test_a_failure_that_would_repeat_ends_the_process_at_once(tmp_path: Path) -> None:
    handler = Flaky(kafka(KafkaError.MSG_SIZE_TOO_LARGE))
    with pytest.raises(Exited) as exited:
        stream(tmp_path, handler).handle_or_die([])
    assert exited.value.code == 70
    assert handler.calls == 1


def test_a_transient_failure_past_its_budget_ends_the_process(tmp_path: Path) -> None:
    handler = Flaky(*(TimeoutError("still away") for _ in range(1000)))
    with pytest.raises(Exited) as exited:
        stream(tmp_path, handler, budget_s=0.0).handle_or_die([])
    assert exited.value.code == 70
    assert handler.calls == 2, "the first failure starts the clock, the second is past a 0 s budget"


def test_failing_timer_work_skips_ticks_until_its_backoff_passed(tmp_path: Path) -> None:
    work = Flaky(ConnectionError("away"))
    runtime = stream(tmp_path, lambda records: None)
    runtime._retrying["tick"]._backoff._draw = lambda: 0.999  # type: ignore[attr-defined]
    runtime.tick_or_die(work)
    runtime.tick_or_die(work)
    assert work.calls == 1, "the second tick came before the backoff ended"
    runtime._retrying["tick"].next_attempt_at = 0.0
    runtime.tick_or_die(work)
    assert work.calls == 2
    with pytest.raises(Exited):
        runtime.tick_or_die(Flaky(WriterFenced("fenced")))


def test_readiness_names_the_check_that_fails(tmp_path: Path) -> None:
    restored: set[int] = set()
    runtime = stream(tmp_path, Flaky(), restored=lambda: frozenset(restored))

    def failed() -> list[str]:
        return [c.name for c in runtime.checks() if not c.ok]

    assert failed() == ["assignment"]
    runtime.assignment = frozenset({0, 1})
    assert failed() == ["restore"]
    restored.update({0, 1})
    assert failed() == []
    runtime._retrying["batch"].failed(TimeoutError("broker away"))
    assert failed() == ["dependencies"]
    [dependencies] = [c for c in runtime.checks() if c.name == "dependencies"]
    assert "batch failing for" in dependencies.detail and "TimeoutError" in dependencies.detail
    runtime._retrying["batch"].succeeded()
    assert failed() == []
