"""A fake coordinator and effect gateway for the runner SDK's unit tests (httpx.MockTransport).

`FakeTenure` speaks the HTTP contract of the command API and the gateway: claim, heartbeat,
report and effects, with problem+json errors. Time is a fake monotonic clock; the coordinator's
clock is that clock plus an arbitrary offset, so nothing in the SDK may rely on the two agreeing
(LEASE-5). Renewal time-outs are simulated by advancing the fake clock by the time-out the keeper
asked for, then raising httpx.ReadTimeout.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import httpx

__all__ = [
    "API",
    "ATTEMPT_ID",
    "EPOCH",
    "GATEWAY",
    "RUN_ID",
    "SERVER_OFFSET_MS",
    "FakeClock",
    "FakeTenure",
    "problem",
]

API = "http://api.tenure.test"
GATEWAY = "http://gateway.tenure.test"
RUN_ID = "run_01/x y"  # not URL-safe on purpose
ATTEMPT_ID = "att_run_01-3"
EPOCH = 3
SERVER_OFFSET_MS = 1_767_225_600_000 - 4_321  # coordinator epoch ms minus local monotonic ms


class FakeClock:
    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def problem(status: int, slug: str, detail: str = "refused") -> httpx.Response:
    return httpx.Response(
        status,
        json={"type": f"/problems/{slug}", "title": slug, "status": status, "detail": detail},
        headers={"Content-Type": "application/problem+json"},
    )


class FakeTenure:
    """Coordinator + effect gateway of /tmp/issue3-http.md; modes switch its behaviour."""

    def __init__(self, clock: Callable[[], float], advance: Callable[[float], None] | None = None) -> None:
        self._clock = clock
        self._advance = advance
        self.lock = threading.Lock()
        self.lease_ms = 90_000
        self.heartbeat_seconds = 20
        self.expires_at = 0
        self.last_sequence = 0
        self.heartbeat_mode = "ok"  # ok | timeout | stale-epoch | unavailable
        self.report_mode = "ok"  # ok | timeout | unavailable | stale-epoch | lease-expired
        self.effect_mode = "ok"  # ok | stale-epoch | fenced-by-recipient | tool-failed | outcome-unknown
        self.requests: list[tuple[str, str, dict[str, Any]]] = []
        self.headers: list[tuple[str, str, dict[str, str]]] = []  # host, path, request headers
        # Set when the run is asked to stop (EXE-7/EXE-10): heartbeat answers then carry it.
        self.stop: dict[str, Any] | None = None
        self.heartbeat_seen = threading.Event()
        self.heartbeats_wanted = 0

    def server_now(self) -> int:
        return int(self._clock() * 1000) + SERVER_OFFSET_MS

    def true_expiry_local(self) -> float:
        """The local clock reading at which the coordinator considers the lease expired."""
        return (self.expires_at - SERVER_OFFSET_MS) / 1000

    def paths(self, suffix: str) -> list[dict[str, Any]]:
        with self.lock:
            return [body for _, path, body in self.requests if path.endswith(suffix)]

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else {}
        with self.lock:
            self.requests.append((request.url.host, request.url.path, body))
            self.headers.append((request.url.host, request.url.path, dict(request.headers)))
        path = request.url.path
        if request.url.host == "gateway.tenure.test" and path == "/effects":
            return self._effect(body)
        if path.endswith("/attempts") and path.startswith("/runs/"):
            return self._claim()
        if path == f"/attempts/{ATTEMPT_ID}/heartbeat":
            return self._heartbeat(request, body)
        if path == f"/attempts/{ATTEMPT_ID}/report":
            return self._report(request, body)
        return problem(404, "not-found", f"no route {path}")

    def _timeout(self, request: httpx.Request) -> httpx.Response:
        if self._advance is not None:
            self._advance(request.extensions["timeout"]["read"])
        raise httpx.ReadTimeout("timed out", request=request)

    def _claim(self) -> httpx.Response:
        now = self.server_now()
        self.expires_at = now + self.lease_ms
        return httpx.Response(
            201,
            json={
                "runId": RUN_ID,
                "attemptId": ATTEMPT_ID,
                "attemptNumber": 1,
                "leaseId": "lease_run_01-3",
                "epoch": EPOCH,
                "expiresAt": self.expires_at,
                "leaseSeconds": self.lease_ms // 1000,
                "heartbeatIntervalSeconds": self.heartbeat_seconds,
                "serverTime": now,
                "assignment": {"executionSpec": {"image": "agent@sha256:aa"}, "specDigest": "sha256:5p"},
            },
        )

    def _fence(self, body: dict[str, Any]) -> httpx.Response | None:
        if body["leaseEpoch"] != EPOCH:
            return problem(409, "stale-epoch", f"epoch {body['leaseEpoch']} is stale")
        if self.server_now() >= self.expires_at:
            return problem(409, "lease-expired", "the lease expired")
        if body["sequence"] <= self.last_sequence:
            return problem(409, "sequence-not-increasing", f"{body['sequence']} <= {self.last_sequence}")
        return None

    def _heartbeat(self, request: httpx.Request, body: dict[str, Any]) -> httpx.Response:
        try:
            mode = self.heartbeat_mode
            if mode == "timeout":
                return self._timeout(request)
            if mode == "unavailable":
                return problem(503, "unavailable", "Kafka is not reachable")
            if mode == "stale-epoch":
                return problem(409, "stale-epoch", "run is at epoch 4")
            refused = self._fence(body)
            if refused is not None:
                return refused
            now = self.server_now()
            self.last_sequence = body["sequence"]
            self.expires_at = now + self.lease_ms
            answer: dict[str, Any] = {
                "attemptId": ATTEMPT_ID,
                "epoch": EPOCH,
                "sequence": body["sequence"],
                "expiresAt": self.expires_at,
                "serverTime": now,
                "certainty": "active",
                "runStatus": "running" if self.stop is None else "cancelling",
            }
            if self.stop is not None:
                answer.update(self.stop)
            return httpx.Response(200, json=answer)
        finally:
            if len(self.paths("/heartbeat")) >= self.heartbeats_wanted > 0:
                self.heartbeat_seen.set()

    def _report(self, request: httpx.Request, body: dict[str, Any]) -> httpx.Response:
        if self.report_mode == "timeout":
            return self._timeout(request)
        if self.report_mode == "unavailable":
            return problem(503, "unavailable", "Kafka is not reachable")
        if self.report_mode != "ok":
            return problem(409, self.report_mode, "refused")
        if body["outcome"] == "cancelled" and self.stop is None:
            # As the coordinator: only a run asked to stop can report cancelled (a 422).
            return problem(422, "validation-failed", "only a run asked to stop can report cancelled")
        refused = self._fence(body)
        if refused is not None:
            return refused
        self.last_sequence = body["sequence"]
        return httpx.Response(200, json={"runId": RUN_ID, "status": body["outcome"]})

    def _effect(self, body: dict[str, Any]) -> httpx.Response:
        mode = self.effect_mode
        if mode == "tool-failed":
            return problem(502, "tool-failed", "ledger answered 500")
        if mode == "outcome-unknown":
            return problem(504, "outcome-unknown", "ledger did not answer")
        if mode != "ok":
            return problem(409, mode, f"epoch {body['epoch']} refused")
        return httpx.Response(
            200,
            json={
                "effectId": f"eff-{body['idempotencyKey']}",
                "outcome": "committed",
                "toolStatus": 200,
                "toolResponse": {"ok": True},
                "reconciled": False,
            },
        )
