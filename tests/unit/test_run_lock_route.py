"""GET /runs/{runId}/lock on the real app over the in-memory Tenure (EXE-16): a self-verifying
document of the spec exactly as submitted, a read that publishes nothing, clear refusals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from services.common.contracts.locks import digest_of, lock_problems
from services.common.ids import run_id_for
from tests.support.api_harness import api_client

pytestmark = pytest.mark.timeout(60)

KEYS = "rita-key=rita:submitter,sam-key=sam:submitter"
RITA = {"Authorization": "Bearer rita-key"}


@pytest.fixture()
def api(tmp_path: Path) -> Any:
    with api_client(tmp_path, api_keys=KEYS) as pair:
        yield pair


def _submit(client: Any, spec: dict[str, Any], key: str) -> str:
    response = client.post(
        "/runs",
        headers={**RITA, "Idempotency-Key": key},
        json={"tenant": "acme", "executionSpec": spec, "timeoutSeconds": 60, "agentRevisionId": "rev-7"},
    )
    assert response.status_code == 201, response.text
    return str(response.json()["runId"])


def test_the_lock_pins_the_spec_as_submitted_and_records_nothing_EXE_16(api: Any) -> None:
    client, tenure = api
    spec = {"zeta": [3, {"b": 1, "a": "ü"}], "agent": "local"}
    run_id = _submit(client, spec, "lock-1")
    published = len(tenure.commands)
    response = client.get(f"/runs/{run_id}/lock", headers=RITA)
    assert response.status_code == 200, response.text
    lock = response.json()
    assert lock_problems(lock) == []
    assert lock["executionSpec"] == spec and lock["specDigest"] == digest_of(spec)
    assert (lock["runId"], lock["tenant"], lock["agentRevisionId"]) == (run_id, "acme", "rev-7")
    assert lock["artifacts"] == []
    assert client.get(f"/runs/{run_id}/lock", headers=RITA).json() == lock, "the same lock every time"
    assert len(tenure.commands) == published, "reading a lock publishes nothing"
    assert client.get(f"/runs/{run_id}/lock").status_code == 401


def test_a_lock_is_refused_clearly_for_a_missing_run_or_malformed_inputs_EXE_16(api: Any) -> None:
    client, _ = api
    missing = client.get(f"/runs/{run_id_for('acme', 'nope')}/lock", headers=RITA)
    assert missing.status_code == 404 and missing.json()["type"] == "/problems/run-not-found"
    run_id = _submit(client, {"inputs": ["not-an-artifact"]}, "lock-2")
    bad = client.get(f"/runs/{run_id}/lock", headers=RITA)
    assert bad.status_code == 422 and bad.json()["type"] == "/problems/validation-failed", bad.text
    assert "not an artifact id" in bad.json()["detail"]
    named = client.get(f"/runs/{run_id}/lock/artifacts/art_{'0' * 32}", headers=RITA)
    assert named.status_code == 422, named.text  # the spec's inputs are malformed, not the id
