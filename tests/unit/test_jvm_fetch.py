"""`fetch_with_maven`, the one fetch the broker, the cluster and the registry launchers share:
a failed or half-done fetch never leaves a cache that looks complete, and a complete one is
moved into place in one rename."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from services.common import jvm

pytestmark = pytest.mark.timeout(30)


class FetchFailed(RuntimeError):
    pass


def _maven(monkeypatch: pytest.MonkeyPatch, returncode: int = 0, write: bool = True) -> list[list[str]]:
    calls: list[list[str]] = []

    def fake_run(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        calls.append(command)
        out = Path(next(a for a in command if a.startswith("-DoutputDirectory=")).split("=", 1)[1])
        if write:
            out.mkdir(parents=True)
            (out / "thing.jar").write_bytes(b"jar")
        return subprocess.CompletedProcess(command, returncode, "", "boom" if returncode else "")

    monkeypatch.setattr(jvm.shutil, "which", lambda name: "/usr/bin/mvn")
    monkeypatch.setattr(subprocess, "run", fake_run)
    return calls


def _fetch(cache: Path, finish: object = None) -> None:
    def default_finish(staging: Path) -> None:
        (staging / "MARKER").write_text("ok")

    jvm.fetch_with_maven(
        cache,
        "the thing",
        lambda staging: ["dependency:copy", f"-DoutputDirectory={staging}"],
        finish or default_finish,  # type: ignore[arg-type]
        lambda c: (c / "MARKER").is_file(),
        FetchFailed,
    )


def test_a_fetch_lands_in_one_rename_with_its_marker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _maven(monkeypatch)
    cache = tmp_path / "cache" / "libs"
    _fetch(cache)
    assert calls[0][:3] == ["/usr/bin/mvn", "-q", "-B"]
    assert (cache / "thing.jar").read_bytes() == b"jar" and (cache / "MARKER").is_file()
    assert not list(cache.parent.glob("libs.fetch-*"))


def test_a_failing_maven_leaves_no_cache_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _maven(monkeypatch, returncode=1)
    cache = tmp_path / "libs"
    with pytest.raises(FetchFailed, match="mvn exited with 1 fetching the thing:\nboom"):
        _fetch(cache)
    assert not cache.exists() and not list(tmp_path.glob("libs.fetch-*"))


def test_a_fetch_its_check_refuses_is_removed_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _maven(monkeypatch)

    def refuse(staging: Path) -> None:
        raise FetchFailed("the archive has no runner")

    cache = tmp_path / "libs"
    with pytest.raises(FetchFailed, match="no runner"):
        _fetch(cache, refuse)
    assert not cache.exists() and not list(tmp_path.glob("libs.fetch-*"))


def test_no_maven_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jvm.shutil, "which", lambda name: None)
    with pytest.raises(
        FetchFailed, match=r"Maven \('mvn'\) is not on PATH; it is needed once to fetch the thing"
    ):
        _fetch(tmp_path / "libs")


def test_a_log_tail_names_its_file_and_keeps_the_last_lines(tmp_path: Path) -> None:
    log = tmp_path / "broker.log"
    log.write_text("".join(f"line {i}\n" for i in range(50)))
    assert jvm.log_tail(log, 2) == f"tail of {log}:\nline 48\nline 49"
    assert jvm.log_tail(tmp_path / "none.log") == f"tail of {tmp_path / 'none.log'}:\n(no log written)"
