"""What every JVM the project launches needs: Java, its jars fetched once from Maven Central, and
the tail of its log when it fails (the Kafka broker and cluster, the Apicurio registry)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from services.common.settings import TenureSettings

__all__ = ["fetch_with_maven", "find_java", "log_tail"]

# A first fetch of Kafka's or Apicurio's jars on a cold Maven cache takes minutes, not more.
_FETCH_TIMEOUT_S = 900


def find_java(error: type[Exception]) -> str:
    """The `java` of JAVA_HOME (TENURE's settings), else the one on PATH; `error` if neither."""
    java_home = TenureSettings().java_home
    found = str(java_home / "bin" / "java") if java_home else shutil.which("java")
    if not found or not Path(found).exists():
        raise error("no 'java' found (set JAVA_HOME or put Java 17+ on PATH)")
    return found


def log_tail(log_file: Path, lines: int = 30) -> str:
    """The last `lines` lines of a process's log, for the error that says why it did not start."""
    try:
        tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        tail = "(no log written)"
    return f"tail of {log_file}:\n{tail}"


def fetch_with_maven(
    cache_dir: Path,
    what: str,
    mvn_arguments: Callable[[Path], list[str]],
    finish: Callable[[Path], None],
    complete: Callable[[Path], bool],
    error: type[Exception],
) -> None:
    """Fill `cache_dir` by running `mvn <mvn_arguments(staging)>` into a private staging folder,
    `finish(staging)` (check, unpack, write the completion marker), then one rename.

    Why the staging folder and the rename: a crash or a concurrent fetch must never leave a
    half-filled cache that looks complete. If the rename loses to a concurrent fetch that made
    `complete(cache_dir)` true, its copy is just as good."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise error(f"Maven ('mvn') is not on PATH; it is needed once to fetch {what}")
    staging = cache_dir.with_name(f"{cache_dir.name}.fetch-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    command = [mvn, "-q", "-B", *mvn_arguments(staging)]
    try:
        result = subprocess.run(
            command, check=False, capture_output=True, text=True, timeout=_FETCH_TIMEOUT_S
        )
    except subprocess.TimeoutExpired as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise error(f"mvn did not fetch {what} within {_FETCH_TIMEOUT_S} s") from exc
    if result.returncode != 0 or not staging.is_dir():
        shutil.rmtree(staging, ignore_errors=True)
        tail = (result.stdout + result.stderr).strip()[-2000:]
        raise error(f"mvn exited with {result.returncode} fetching {what}:\n{tail}")
    try:
        finish(staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    shutil.rmtree(cache_dir, ignore_errors=True)
    cache_dir.parent.mkdir(parents=True, exist_ok=True)
    try:
        staging.rename(cache_dir)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if not complete(cache_dir):
            raise error(f"could not move {what} into {cache_dir}: {exc}") from exc
