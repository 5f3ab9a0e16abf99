"""Every quarantine rejection code maps to a problem type that documents itself (QUA-1, QUA-2)."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from services.command_api.app import create_app
from services.command_api.problems import CATALOG, QUARANTINE_REJECTION_PROBLEMS
from services.common.contracts.quarantine import QuarantineRejectionCode
from services.effect_gateway.app import CATALOG as GATEWAY_CATALOG
from tests.support.api_harness import InMemoryTenure


def test_every_quarantine_code_maps_to_a_documented_problem_type(tmp_path: Path) -> None:
    missing = sorted(
        code.value for code in QuarantineRejectionCode if code not in QUARANTINE_REJECTION_PROBLEMS
    )
    assert not missing, f"quarantine codes without a problem type: {missing}"
    assert all(slug in CATALOG for slug in QUARANTINE_REJECTION_PROBLEMS.values())
    assert "run-quarantined" in GATEWAY_CATALOG and "egress-not-allowed" in GATEWAY_CATALOG
    tenure = InMemoryTenure()
    with TestClient(create_app(lambda: tenure.dependencies(tmp_path))) as client:
        for slug in {*QUARANTINE_REJECTION_PROBLEMS.values(), "run-quarantined", "artifact-quarantined"}:
            response = client.get(f"/problems/{slug}")
            assert response.status_code == 200, slug


def test_the_quarantine_routes_answer_503_without_their_fold(tmp_path: Path) -> None:
    tenure = InMemoryTenure()  # its dependencies have no quarantine fold
    with TestClient(create_app(lambda: tenure.dependencies(tmp_path))) as client:
        response = client.get("/artifacts/art_" + "0" * 32 + "/envelope")
    assert response.status_code == 503 and response.headers["content-type"].startswith(
        "application/problem+json"
    )
