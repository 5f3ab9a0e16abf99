"""The one backoff function of Tenure: full jitter (BRK-3); see services/runner_sdk/backoff.py.

Defined in the runner SDK (pure, no dependency) so that the SDK's own distribution (sdk/,
tenure-sdk) is self-contained; the services import it from here, as they always have.
"""

from services.runner_sdk.backoff import Backoff, full_jitter_ms, full_jitter_s

__all__ = ["Backoff", "full_jitter_ms", "full_jitter_s"]
