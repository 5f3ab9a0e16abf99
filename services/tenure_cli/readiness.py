"""Is a Tenure process ready? The probes `tenure up` waits on before it says "Tenure is up".

HTTP processes answer `GET /readyz` (200 ready, 503 not yet). A process that has no /readyz
(404) is probed at /healthz instead. The processors without an API of their own (lease
coordinator, projections, saga orchestrator) serve /readyz on their health ports; one that
never opens its port is taken as having no endpoint (an older build) once it has been alive for
`ABSENT_GRACE_S`, and `tenure up` says so rather than waiting forever.
"""

from __future__ import annotations

import enum
import http.client
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ABSENT_GRACE_S", "PROBE_INTERVAL_S", "Answer", "ReadinessCheck", "http_answer", "probe_host"]

ABSENT_GRACE_S = 10.0
# A readiness check may take its time (the API gives each dependency a second): ask each child
# at most once a second and wait for the answer, or the probes themselves pile up in its threads.
PROBE_INTERVAL_S = 1.0
PROBE_TIMEOUT_S = 5.0


class Answer(enum.Enum):
    READY = "ready"
    NOT_READY = "not ready"
    ABSENT = "not listening"


def probe_host(host: str) -> str:
    """Where to reach a server bound to `host` from this machine (a wildcard means loopback)."""
    return {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)


def _get(url: str, timeout_s: float) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def http_answer(base_url: str, timeout_s: float = PROBE_TIMEOUT_S) -> tuple[Answer, str]:
    """GET base_url/readyz (falling back to /healthz on 404): the answer and how it was found."""
    try:
        status = _get(f"{base_url}/readyz", timeout_s)
        if status == 404:
            status = _get(f"{base_url}/healthz", timeout_s)
            return (Answer.READY if status == 200 else Answer.NOT_READY), f"/healthz {status} (no /readyz)"
        return (Answer.READY if status == 200 else Answer.NOT_READY), f"/readyz {status}"
    except urllib.error.URLError as error:
        if isinstance(error.reason, ConnectionRefusedError):
            return Answer.ABSENT, "connection refused"
        return Answer.NOT_READY, str(error.reason)
    except ConnectionRefusedError:
        return Answer.ABSENT, "connection refused"
    except (OSError, http.client.HTTPException) as error:  # timeouts and resets included
        return Answer.NOT_READY, f"{type(error).__name__}: {error}"


@dataclass(frozen=True)
class ReadinessCheck:
    """What makes one child ready: files that must exist, then an HTTP answer (if any)."""

    url: str | None = None
    optional_endpoint: bool = False  # the processors' health ports: tolerate their absence
    files: tuple[Path, ...] = ()

    def state(self, alive_for_s: float) -> tuple[bool, str]:
        """(ready, why) for a child that has been running for `alive_for_s` seconds."""
        for path in self.files:
            if not path.exists():
                return False, f"waiting for {path}"
        if self.url is None:
            made = ", ".join(str(p) for p in self.files)
            return True, f"{made} exists" if made else "running (no readiness endpoint configured)"
        answer, how = http_answer(self.url)
        if answer is Answer.READY:
            return True, f"{self.url} {how}"
        if answer is Answer.ABSENT and self.optional_endpoint and alive_for_s >= ABSENT_GRACE_S:
            return True, f"nothing answers at {self.url} after {alive_for_s:.0f}s; assumed ready"
        return False, f"{self.url} {how}"
