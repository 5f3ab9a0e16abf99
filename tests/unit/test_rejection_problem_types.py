"""Every code the coordinator or the saga can reject with has a problem type (issues 10 and 11).

The codes are collected from the domains themselves: the lease coordinator's RejectionCode enum,
and every `Rejection("<CODE>", ...)` the saga orchestrator's domain constructs (its f-string
`TRAJECTORY_{status.name}` expands to every TrajectoryStatus). Each must be mapped explicitly by
the API (not left to a catch-all) to a problem type that documents itself at /problems/{slug}.
"""

from __future__ import annotations

import ast
from pathlib import Path

from fastapi.testclient import TestClient

from services.command_api.app import create_app
from services.command_api.problems import CATALOG, REJECTION_PROBLEMS, TRAJECTORY_REJECTION_PROBLEMS
from services.lease_coordinator.domain import RejectionCode
from services.saga_orchestrator.domain import TrajectoryStatus
from tests.support.api_harness import InMemoryTenure

# Rejection(f"TRAJECTORY_{state.status.name}", ...): one code per trajectory status.
_BY_STATUS = "f'TRAJECTORY_{state.status.name}'"
SAGA_DOMAIN = Path(__file__).resolve().parents[2] / "services" / "saga_orchestrator" / "domain"


def _saga_codes() -> set[str]:
    codes: set[str] = set()
    for source in sorted(SAGA_DOMAIN.rglob("*.py")):
        for node in ast.walk(ast.parse(source.read_text(), str(source))):
            if not (isinstance(node, ast.Call) and node.args):
                continue
            name = getattr(node.func, "id", getattr(node.func, "attr", None))
            if name != "Rejection":
                continue
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                codes.add(first.value)
            elif isinstance(first, ast.JoinedStr) and ast.unparse(first) == _BY_STATUS:
                codes.update(f"TRAJECTORY_{status.name}" for status in TrajectoryStatus)
            else:
                raise AssertionError(f"{source}:{node.lineno}: a rejection code this test cannot read")
    return codes


def test_the_saga_codes_are_really_collected() -> None:
    codes = _saga_codes()
    assert {"STEP_IN_FLIGHT", "UNKNOWN_TOOL", "TRAJECTORY_FROZEN", "LEASE_REQUIRED"} <= codes


def test_every_coordinator_code_maps_to_a_documented_problem_type() -> None:
    # DUPLICATE_SEQUENCE on a heartbeat is answered from the lease, not as a problem, but a
    # report can still meet it.
    missing = sorted(code.value for code in RejectionCode if code.value not in REJECTION_PROBLEMS)
    assert not missing, f"coordinator codes without a problem type: {missing}"
    assert all(slug in CATALOG for slug in REJECTION_PROBLEMS.values())


def test_every_saga_code_maps_to_a_documented_problem_type() -> None:
    missing = sorted(_saga_codes() - set(TRAJECTORY_REJECTION_PROBLEMS))
    assert not missing, f"saga codes without a problem type: {missing}"
    assert all(slug in CATALOG for slug in TRAJECTORY_REJECTION_PROBLEMS.values())


def test_each_mapped_problem_type_documents_itself(tmp_path: Path) -> None:
    tenure = InMemoryTenure()
    slugs = sorted(set(REJECTION_PROBLEMS.values()) | set(TRAJECTORY_REJECTION_PROBLEMS.values()))
    with TestClient(create_app(lambda: tenure.dependencies(tmp_path))) as client:
        for slug in [*slugs, "not-ready", "idempotency-key-conflict", "unavailable"]:
            response = client.get(f"/problems/{slug}")
            assert response.status_code == 200, slug
            described = response.json()
            assert described["type"] == f"/problems/{slug}" and described["meaning"], slug
