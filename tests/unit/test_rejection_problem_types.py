"""Every code the coordinator or the saga can reject with has a problem type (issues 10 and 11).

The codes are the members of each aggregate's rejection enum (services/common/contracts/
rejections.py): the lease coordinator's RejectionCode and the saga orchestrator's
TrajectoryRejectionCode, which the domains build every Rejection from. Each must be mapped
explicitly by the API (not left to a catch-all) to a problem type that documents itself at
/problems/{slug}.
"""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from services.command_api.app import create_app
from services.command_api.problems import CATALOG, REJECTION_PROBLEMS, TRAJECTORY_REJECTION_PROBLEMS
from services.common.contracts import RejectionCode, TrajectoryRejectionCode
from services.saga_orchestrator.domain import TrajectoryStatus, code_for_status
from tests.support.api_harness import InMemoryTenure


def test_the_saga_codes_are_really_collected() -> None:
    codes = set(TrajectoryRejectionCode)
    assert {"STEP_IN_FLIGHT", "UNKNOWN_TOOL", "TRAJECTORY_FROZEN", "LEASE_REQUIRED"} <= codes
    # The codes once built as f"TRAJECTORY_{status.name}": one member per status, same wire value.
    for status in TrajectoryStatus:
        assert code_for_status(status).value == f"TRAJECTORY_{status.name}"


def test_every_coordinator_code_maps_to_a_documented_problem_type() -> None:
    # DUPLICATE_SEQUENCE on a heartbeat is answered from the lease, not as a problem, but a
    # report can still meet it.
    missing = sorted(code.value for code in RejectionCode if code not in REJECTION_PROBLEMS)
    assert not missing, f"coordinator codes without a problem type: {missing}"
    assert all(slug in CATALOG for slug in REJECTION_PROBLEMS.values())


def test_every_saga_code_maps_to_a_documented_problem_type() -> None:
    missing = sorted(
        code.value for code in TrajectoryRejectionCode if code not in TRAJECTORY_REJECTION_PROBLEMS
    )
    assert not missing, f"saga codes without a problem type: {missing}"
    assert all(slug in CATALOG for slug in TRAJECTORY_REJECTION_PROBLEMS.values())


def test_the_wire_strings_find_the_enum_keyed_mappings() -> None:
    # CommandRejected carries a plain string after decoding; the enum keys must still match it.
    assert REJECTION_PROBLEMS["RUN_NOT_FOUND"] == "run-not-found"
    assert TRAJECTORY_REJECTION_PROBLEMS["TRAJECTORY_ROLLED_BACK"] == "trajectory-ended"


def test_each_mapped_problem_type_documents_itself(tmp_path: Path) -> None:
    tenure = InMemoryTenure()
    slugs = sorted(set(REJECTION_PROBLEMS.values()) | set(TRAJECTORY_REJECTION_PROBLEMS.values()))
    with TestClient(create_app(lambda: tenure.dependencies(tmp_path))) as client:
        for slug in [*slugs, "not-ready", "idempotency-key-conflict", "unavailable"]:
            response = client.get(f"/problems/{slug}")
            assert response.status_code == 200, slug
            described = response.json()
            assert described["type"] == f"/problems/{slug}" and described["meaning"], slug
