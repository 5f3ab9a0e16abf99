"""Logs are JSON with the service on every line, and the run/record context where it applies
(issue 17, "Logs"); uvicorn's loggers, its access log included, go through the same formatter."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from services.common.logs import configure_logging, log_fields, uvicorn_log_config
from services.common.settings import child_environment
from tests.support.tenure import free_port

pytestmark = pytest.mark.timeout(60)


@pytest.fixture()
def logged() -> Iterator[io.StringIO]:
    """What configure_logging's handler writes (root's and tenure's are one handler)."""
    configure_logging("INFO", service="tenure-test")
    handler = logging.getLogger("tenure").handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    buffer = io.StringIO()
    handler.setStream(buffer)
    yield buffer
    logging.getLogger().handlers.clear()
    logging.getLogger("tenure").handlers.clear()


def test_every_line_names_the_service_and_carries_the_context_given(logged: io.StringIO) -> None:
    log = logging.getLogger("tenure.test")
    log.warning("a plain line")
    log.error("about one record", extra=log_fields(run_id="run_1", partition=3, offset=42, epoch=None))
    logging.getLogger("some.library").warning("a library's line")
    lines = [json.loads(line) for line in logged.getvalue().splitlines()]
    assert len(lines) == 3 and all(line["service"] == "tenure-test" for line in lines)
    record = next(line for line in lines if line["msg"] == "about one record")
    assert record["runId"] == "run_1" and record["partition"] == 3 and record["offset"] == 42
    assert "epoch" not in record  # a None is left out, not written as null
    assert lines[2]["logger"] == "some.library"


def test_an_unknown_context_name_is_a_mistake_at_the_call_site() -> None:
    with pytest.raises(TypeError, match="unknown log context"):
        log_fields(runid="x")


def test_uvicorn_loggers_propagate_to_the_json_handler() -> None:
    config = uvicorn_log_config()
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        assert config["loggers"][name]["handlers"] == [] and config["loggers"][name]["propagate"] is True


def test_the_access_log_switched_on_gives_a_json_line_per_request_with_its_fields() -> None:
    port = free_port()
    env = child_environment(
        TENURE_ACCESS_LOG="true",
        TENURE_SIM_PORT=str(port),
        TENURE_SIM_HOST="127.0.0.1",
        TENURE_LOG_LEVEL="INFO",
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "services.sim_environment"], env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1.0).status_code == 200
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the sim environment did not start"
                time.sleep(0.1)
    finally:
        process.terminate()
        _, err = process.communicate(timeout=20)
    lines = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert len(lines) == len([line for line in err.splitlines() if line.strip()]), err  # all JSON
    access = [line for line in lines if line["logger"] == "uvicorn.access"]
    assert access, err
    assert access[-1]["service"] == "tenure-sim-environment"
    assert access[-1]["method"] == "GET" and access[-1]["path"] == "/healthz" and access[-1]["status"] == 200
