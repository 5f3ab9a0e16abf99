"""The schedules processor's clock: the system clock, optionally moved by an offset file.

Misfire and downtime behaviour (EXE-14) is about hours and days; tests and drills cannot wait
for them. TENURE_SCHEDULES_CLOCK_OFFSET_FILE names a file holding milliseconds to add to the
system clock; it is re-read when its modification time changes, so a test moves the clock of a
running (or restarting) processor forward without touching anything else.
"""

from __future__ import annotations

import time
from pathlib import Path

__all__ = ["OffsetFileClock"]


class OffsetFileClock:
    def __init__(self, path: Path) -> None:
        self._path = path
        self._stamp: int | None = None
        self._offset_ms = 0

    def _offset(self) -> int:
        try:
            stamp = self._path.stat().st_mtime_ns
        except FileNotFoundError:
            return 0
        if stamp != self._stamp:
            try:
                self._offset_ms = int(self._path.read_text().strip() or "0")
            except ValueError:
                return self._offset_ms  # a half-written file: keep the last good offset
            self._stamp = stamp
        return self._offset_ms

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000 + self._offset()
