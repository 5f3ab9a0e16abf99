"""What a Run's view says of it: its status values and the bounds of a submission.

The lifecycle's transition table is the coordinator's (lease_coordinator/domain/lifecycle.py);
the status names and the submission limits are published, so the API can validate against them
without importing the coordinator's domain.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["MAX_ATTEMPTS_LIMIT", "MAX_TIMEOUT_SECONDS", "RunStatus"]

MAX_ATTEMPTS_LIMIT = 10
MAX_TIMEOUT_SECONDS = 7 * 24 * 3600


class RunStatus(StrEnum):
    QUEUED = "queued"
    PREPARING = "preparing"
    RUNNING = "running"
    CANCELLING = "cancelling"
    WAITING_INPUT = "waiting_input"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"
