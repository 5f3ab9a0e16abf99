"""The probes `tenure up` waits on before "Tenure is up" (issue 10), against a real local HTTP server."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from services.tenure_cli.readiness import ABSENT_GRACE_S, Answer, ReadinessCheck, http_answer, probe_host
from tests.support.tenure import free_port

pytestmark = pytest.mark.timeout(30)


class _Server:
    def __init__(self) -> None:
        self.statuses: dict[str, int] = {}
        statuses = self.statuses

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(statuses.get(self.path, 404))
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture
def server() -> Iterator[_Server]:
    running = _Server()
    yield running
    running.httpd.shutdown()
    running.httpd.server_close()


def test_readyz_200_is_ready_and_503_is_not(server: _Server) -> None:
    server.statuses["/readyz"] = 503
    assert http_answer(server.url)[0] is Answer.NOT_READY
    server.statuses["/readyz"] = 200
    assert http_answer(server.url) == (Answer.READY, "/readyz 200")


def test_a_process_without_readyz_is_probed_at_healthz(server: _Server) -> None:
    server.statuses["/healthz"] = 200
    assert http_answer(server.url) == (Answer.READY, "/healthz 200 (no /readyz)")


def test_nothing_listening_is_absent_and_tolerated_only_for_processors_after_the_grace() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert http_answer(url)[0] is Answer.ABSENT
    assert not ReadinessCheck(url, optional_endpoint=True).state(ABSENT_GRACE_S - 1)[0]
    ready, why = ReadinessCheck(url, optional_endpoint=True).state(ABSENT_GRACE_S + 1)
    assert ready and "assumed ready" in why
    assert not ReadinessCheck(url).state(ABSENT_GRACE_S + 100)[0]  # the API must answer


def test_files_must_exist_before_the_endpoint_counts(tmp_path: Path, server: _Server) -> None:
    server.statuses["/readyz"] = 200
    store = tmp_path / "CURRENT"
    check = ReadinessCheck(server.url, files=(store,))
    assert check.state(0) == (False, f"waiting for {store}")
    store.write_text("")
    assert check.state(0)[0]


def test_a_wildcard_bind_is_probed_on_loopback() -> None:
    assert probe_host("0.0.0.0") == "127.0.0.1"
    assert probe_host("10.1.2.3") == "10.1.2.3"
