"""The `tenure` CLI against the real API app in-process (tests/support/api_harness.py): the CLI's
HTTP client is swapped for the app's TestClient; everything else, the keys included, is the
CLI's own."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from services.tenure_cli import api_client
from services.tenure_cli import main as cli
from tests.support.api_harness import InMemoryTenure
from tests.support.api_harness import api_client as harness_client

__all__ = ["BorrowedClient", "cli_on_api", "run_cli"]


class BorrowedClient:
    """The in-process API's client, lent to one CLI command (which closes what it opened)."""

    def __init__(self, client: TestClient) -> None:
        self._client = client

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return self._client.request(method, path, **kwargs)

    def close(self) -> None:
        """The test owns the client."""


@contextmanager
def cli_on_api(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, api_keys: str
) -> Iterator[tuple[TestClient, InMemoryTenure]]:
    """The API app over an InMemoryTenure, with every CLI call going to it."""
    monkeypatch.delenv("TENURE_CLI_API_KEY", raising=False)
    monkeypatch.delenv("TENURE_CLI_API_URL", raising=False)
    with harness_client(tmp_path, api_keys=api_keys, decision_timeout_s=5.0) as (client, tenure):
        monkeypatch.setattr(api_client, "open_client", lambda base, timeout: BorrowedClient(client))
        yield client, tenure


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """`tenure *argv`: its exit code, stdout and stderr."""
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err
