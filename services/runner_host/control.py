"""The host's side of the quarantine contract with the command API (QUA-1).

  GET  /runs/{runId}/quarantine?afterVersion=<v>&waitMs=<ms>   a long-poll: answered the moment
       the quarantine's version exceeds `afterVersion` (or after waitMs with the same version)
  POST /runs/{runId}/quarantine/stages   {"stage", "mechanism", "completedAt", "hostId"} -> 202

Both with the runner's own API key (the lease holder's principal). A stage report is retried
with the one full-jitter backoff (services/common/backoff.py) on a connection error, a timeout,
a 5xx or a 429 until it is accepted or `report_deadline_s` has passed; a definite 4xx is not
retried (it would be refused the same way) and is logged.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal
from urllib.parse import quote

import httpx

from services.common import times
from services.common.backoff import Backoff
from services.common.logs import log_fields
from services.runner_sdk.client import api_http_client

__all__ = [
    "MAX_WAIT_MS",
    "QuarantineChannel",
    "QuarantineUnavailable",
    "QuarantineView",
    "StageReport",
    "rfc3339",
]

log = logging.getLogger("tenure.runner_host")

MAX_WAIT_MS = 30_000
Stage = Literal["suspended", "severed"]


class QuarantineUnavailable(RuntimeError):
    """The quarantine endpoint could not answer (connection, timeout, 5xx, or not there yet)."""


@dataclass(frozen=True)
class QuarantineView:
    run_id: str
    status: str  # none | quarantined | cleared
    version: int
    trigger: Mapping[str, Any] | None
    stages: Mapping[str, Any]
    body: Mapping[str, Any] = field(default_factory=dict)

    @property
    def quarantined(self) -> bool:
        return self.status == "quarantined"


@dataclass(frozen=True)
class StageReport:
    stage: Stage
    mechanism: str
    completed_at: str
    accepted: bool
    attempts: int
    detail: str = ""


def rfc3339(epoch_s: float) -> str:
    """An RFC 3339 UTC timestamp with milliseconds, e.g. 2026-12-01T13:14:36.123Z.

    `epoch_s` is time.time()'s float: rounded half-even to the microsecond (on its exact value:
    a float product would round twice) and cut to the millisecond, as
    datetime.fromtimestamp(...).isoformat(timespec="milliseconds") did."""
    return times.rfc3339(round(Fraction(epoch_s) * 1_000_000) // 1000)


def _retryable(status: int) -> bool:
    return status >= 500 or status == 429


class QuarantineChannel:
    """Long-polls one run's quarantine and reports the host's stages. Thread-safe for one poller
    and any number of reporters (httpx.Client is)."""

    def __init__(
        self,
        api_url: str,
        api_key: str | None,
        host_id: str,
        *,
        transport: httpx.BaseTransport | None = None,
        timeout_s: float = 10.0,
        retry_base_s: float = 0.1,
        retry_cap_s: float = 5.0,
        report_deadline_s: float = 60.0,
        jitter: Callable[[], float] = random.random,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._api_url = api_url.rstrip("/")
        self.host_id = host_id
        self._timeout_s = timeout_s
        self._http = api_http_client(api_key, timeout_s, transport)
        self._retry = (retry_base_s, retry_cap_s)
        self._deadline_s = report_deadline_s
        self.report_deadline_s = report_deadline_s
        self._jitter = jitter
        self._sleep = sleep

    def close(self) -> None:
        self._http.close()

    def backoff(self) -> Backoff:
        return Backoff(self._retry[0], self._retry[1], self._jitter)

    def _url(self, run_id: str, tail: str = "") -> str:
        return f"{self._api_url}/runs/{quote(run_id, safe='')}/quarantine{tail}"

    def poll(self, run_id: str, after_version: int, wait_ms: int) -> QuarantineView:
        """One long-poll. Raises QuarantineUnavailable when no definite answer came."""
        wait_ms = max(0, min(MAX_WAIT_MS, wait_ms))
        try:
            response = self._http.get(
                self._url(run_id),
                params={"afterVersion": after_version, "waitMs": wait_ms},
                timeout=self._timeout_s + wait_ms / 1000.0,  # the server holds it up to waitMs
            )
        except httpx.TransportError as exc:
            raise QuarantineUnavailable(f"{type(exc).__name__}: {exc}") from exc
        if response.status_code != 200:
            # A 404 too: an API without the quarantine routes yet. Keep asking, with backoff.
            raise QuarantineUnavailable(f"HTTP {response.status_code}: {response.text[:200]}")
        try:
            body = response.json()
            return QuarantineView(
                run_id=str(body.get("runId", run_id)),
                status=str(body["status"]),
                version=int(body["version"]),
                trigger=body.get("trigger") if isinstance(body.get("trigger"), dict) else None,
                stages=body.get("stages") if isinstance(body.get("stages"), dict) else {},
                body=body,
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise QuarantineUnavailable(f"unreadable quarantine answer: {exc}") from exc

    def report_stage(self, run_id: str, stage: Stage, mechanism: str, completed_at: float) -> StageReport:
        """POST one completed stage, retried with full jitter until accepted or the deadline."""
        body = {
            "stage": stage,
            "mechanism": mechanism,
            "completedAt": rfc3339(completed_at),
            "hostId": self.host_id,
        }
        backoff = self.backoff()
        deadline = time.monotonic() + self._deadline_s
        attempts = 0
        while True:
            attempts += 1
            try:
                response = self._http.post(self._url(run_id, "/stages"), json=body)
                status, why = response.status_code, f"HTTP {response.status_code}: {response.text[:200]}"
            except httpx.TransportError as exc:
                status, why = 0, f"{type(exc).__name__}: {exc}"
            if 200 <= status < 300:
                return StageReport(stage, mechanism, body["completedAt"], True, attempts)
            if status and not _retryable(status):
                log.error(
                    "stage %s of run %s refused, not retried: %s",
                    stage,
                    run_id,
                    why,
                    extra=log_fields(run_id=run_id),
                )
                return StageReport(stage, mechanism, body["completedAt"], False, attempts, why)
            delay = backoff.next_delay()
            if time.monotonic() + delay > deadline:
                log.error(
                    "stage %s of run %s not reported within %gs: %s",
                    stage,
                    run_id,
                    self._deadline_s,
                    why,
                    extra=log_fields(run_id=run_id),
                )
                return StageReport(stage, mechanism, body["completedAt"], False, attempts, why)
            if attempts == 1:
                log.warning(
                    "stage %s of run %s not accepted yet (%s); retrying",
                    stage,
                    run_id,
                    why,
                    extra=log_fields(run_id=run_id),
                )
            self._sleep(delay)
