"""Every server-side log line about a run carries the run as a JSON field (issue 17: "where
they apply the run id ..."), so an operator filters logs by `runId` instead of parsing messages.

Checked mechanically over services/ (the runner SDK excepted: its logs are its user's): a
logging call that passes a run id among its arguments (a name or attribute `run_id`) must also
pass `extra=log_fields(run_id=...)`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

SERVICES = Path(__file__).resolve().parents[2] / "services"
LEVELS = {"debug", "info", "warning", "error", "exception", "critical"}


def _names_a_run(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id == "run_id") or (
        isinstance(node, ast.Attribute) and node.attr == "run_id"
    )


def _unfielded_run_logs(path: Path, root: Path = SERVICES.parent) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        target = node.func.value
        if node.func.attr not in LEVELS or not (
            isinstance(target, ast.Name) and target.id in {"log", "logger"}
        ):
            continue
        if any(_names_a_run(arg) for arg in node.args[1:]) and not any(
            k.arg == "extra" for k in node.keywords
        ):
            found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_every_log_line_naming_a_run_carries_it_as_a_field() -> None:
    files = [p for p in SERVICES.rglob("*.py") if "runner_sdk" not in p.parts]
    missing = [where for path in files for where in _unfielded_run_logs(path)]
    assert missing == [], f"log calls naming a run without extra=log_fields(run_id=...): {missing}"


def test_the_check_sees_a_call_without_the_field(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text('log.warning("run %s failed", run_id)\nlog.info("ok %s", run_id, extra={})\n')
    assert _unfielded_run_logs(sample, tmp_path) == ["sample.py:1"]
