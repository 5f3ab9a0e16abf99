"""`tenure rebuild` against a store a live projector holds: one clear line, not RocksDB's (issue 10)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from services.common.store import RocksStore
from services.projections.service import views_path
from services.tenure_cli.supervisor import store_in_use

pytestmark = pytest.mark.timeout(60)

REPO_ROOT = Path(__file__).resolve().parents[2]


def _rebuild(state_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "TENURE_STATE_DIR": str(state_dir),
        # Never reached: the store is refused before Kafka is asked anything.
        "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9",
    }
    return subprocess.run(
        [sys.executable, "-m", "services.tenure_cli", "rebuild"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )


def test_rebuild_of_a_store_a_projector_holds_says_what_to_do_in_one_line(tmp_path: Path) -> None:
    path = views_path(tmp_path / "state")
    held = RocksStore(path)  # this test process plays the live projector: it holds the LOCK
    try:
        result = _rebuild(tmp_path / "state")
    finally:
        held.close()
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith("tenure rebuild: ")
    assert str(path) in line
    assert "stop it first" in line and "TENURE_STATE_DIR" in line
    # RocksDB's own wording stays out of it.
    assert "IO error" not in line and "Resource temporarily unavailable" not in line
    assert result.stdout == ""


def test_the_lock_probe_sees_a_holder_and_leaves_a_free_store_openable(tmp_path: Path) -> None:
    path = tmp_path / "views"
    assert not store_in_use(path)  # no store yet
    RocksStore(path).close()
    assert not store_in_use(path)
    # The probe took and dropped the lock; RocksDB can still open the store.
    RocksStore(path).close()
