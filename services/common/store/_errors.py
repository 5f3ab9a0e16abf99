"""Which RocksDB errors are worth retrying in-process (the stream runtime asks, BRK-3).

rocksdict raises a bare `Exception` whose text starts with RocksDB's Status (Status::ToString),
so the status is all there is to tell a passing I/O problem from corruption or a bug.
"""

from __future__ import annotations

__all__ = ["is_transient_store_error"]

# An I/O error (a full or slow disk), a busy or timed-out lock, "try again": a later attempt may
# succeed. Corruption, an invalid argument or a closed database give the same answer every time.
_TRANSIENT_STATUS = (
    "IO error",
    "Busy",
    "Operation timed out",
    "Operation failed. Try again",
    "Result incomplete",
    "Operation aborted",
)


def is_transient_store_error(exc: BaseException) -> bool:
    return type(exc) is Exception and str(exc).startswith(_TRANSIENT_STATUS)
