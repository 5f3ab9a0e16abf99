"""What a gateway instance (or runner) sends to the breakers, and how it learns their answers.

`BreakerClient` publishes breaker commands through the one routing helper (services.common.
routing `breaker_command_record`) and matches the decisions it waits for by causation id, with
the same DecisionListener + publish_and_await the API uses for runs and trajectories, following
breakers.events and breakers.rejections:

  * `record_outcome`: every call's outcome, fire and forget (the breaker drops a redelivery by
    the instance's `seq`, which starts at this process's start time in microseconds and grows by
    one per outcome, so a restarted instance under the same id is never mistaken for a repeat);
  * `request_canary` / `report_canary`: the one canary slot of a half-open breaker (BRK-2);
  * `force_open` / `disable` / `reset`: the operators' commands (the caller checks the role).

Telemetry never fails a call: an outcome that cannot be queued is counted in `dropped` and lost.
"""

from __future__ import annotations

import itertools
import logging
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from services.common.clock import Clock, SystemClock
from services.common.contracts import (
    BREAKER_EVENT_TYPES,
    BreakerCommand,
    CanaryGranted,
    DisableBreaker,
    ForceOpenBreaker,
    RecordCallOutcome,
    ReportCanary,
    RequestCanary,
    ResetBreaker,
)
from services.common.decisions import Decided, Decision, DecisionBook, DecisionListener, Publisher, Rejected
from services.common.decisions import publish_and_await as _publish_and_await
from services.common.ids import derived_id
from services.common.kafka import CommandPublisher
from services.common.messages import MessageCodec
from services.common.routing import breaker_command_record
from services.common.topics import BREAKERS_EVENTS, BREAKERS_REJECTIONS

__all__ = ["UNDECIDED", "BreakerClient", "CanaryAnswer"]

log = logging.getLogger("tenure.breakers.client")
# The code of a canary request whose decision did not arrive in time (it may still be granted:
# then the slot is this instance's until its lease runs out, and nobody else's meanwhile).
UNDECIDED = "UNDECIDED"


@dataclass(frozen=True)
class CanaryAnswer:
    """`granted`: this instance may send the one canary call now, as `canary_id`, and must
    report it (`report_canary`) before `expires_at`. Otherwise `code` says why not (a
    BreakerRejectionCode value, or UNDECIDED) and the call fails fast."""

    granted: bool
    canary_id: str = ""
    expires_at: int = 0
    code: str = ""
    detail: str = ""


class BreakerClient:
    def __init__(
        self,
        publisher: Publisher,
        listener: DecisionBook,
        instance_id: str,
        *,
        actor: str = "tenure-gateway",
        codec: MessageCodec | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._publisher = publisher
        self._listener = listener
        self.instance_id = instance_id
        self.actor = actor
        self._codec = codec or MessageCodec()
        self._clock = clock or SystemClock()
        # Strictly increasing per instance id across restarts: start at now in microseconds.
        self._seq = itertools.count(self._clock.now_ms() * 1000)
        self._seq_lock = threading.Lock()
        self._owned: list[Any] = []
        self.dropped = 0

    @classmethod
    def connect(
        cls, bootstrap_servers: str, instance_id: str, *, actor: str = "tenure-gateway"
    ) -> BreakerClient:
        """A client with its own publisher and decision listener (closed by `close`)."""
        codec = MessageCodec()
        publisher = CommandPublisher(bootstrap_servers, client_id=f"tenure-breakers-{instance_id}")
        listener = DecisionListener(
            bootstrap_servers,
            codec,
            topics=(BREAKERS_EVENTS.name, BREAKERS_REJECTIONS.name),
            event_types=BREAKER_EVENT_TYPES,
            client_id=f"tenure-breaker-decisions-{instance_id}",
        )
        client = cls(publisher, listener, instance_id, actor=actor, codec=codec)
        client._owned = [listener, publisher]
        return client

    def close(self) -> None:
        for owned in self._owned:
            owned.close()
        self._owned = []

    def _next_seq(self) -> int:
        with self._seq_lock:
            return next(self._seq)

    def _header(
        self,
        endpoint: str,
        kind: str,
        actor: str | None = None,
        seq: int | None = None,
        command_id: str | None = None,
    ) -> dict[str, Any]:
        seq = self._next_seq() if seq is None else seq
        return {
            "command_id": command_id or derived_id("cmd", self.instance_id, kind, str(seq)),
            "run_id": endpoint,
            "issued_at": self._clock.now_ms(),
            "correlation_id": endpoint,
            "actor": actor or self.actor,
        }

    # --- telemetry ------------------------------------------------------------------------------

    def record_outcome(
        self, endpoint: str, outcome: str, duration_ms: int, detail: str = ""
    ) -> Future[int] | None:
        """Report one call's outcome; returns the publish's future, or None when it was dropped."""
        seq = self._next_seq()
        command = RecordCallOutcome(
            **self._header(endpoint, "outcome", seq=seq),
            instance_id=self.instance_id,
            seq=seq,
            outcome=outcome,
            duration_ms=max(0, int(duration_ms)),
            detail=detail[:200],
        )
        try:
            future: Future[int] = self._publisher.publish(breaker_command_record(self._codec, command))
        except Exception as exc:  # a full queue or a broker away: the call itself is not affected
            self.dropped += 1
            if self.dropped in (1, 10, 100) or self.dropped % 1000 == 0:
                log.warning("%d breaker outcome(s) dropped (last: %s)", self.dropped, exc)
            return None
        return future

    # --- the canary -----------------------------------------------------------------------------

    async def request_canary(self, endpoint: str, timeout_s: float = 2.0) -> CanaryAnswer:
        command = RequestCanary(**self._header(endpoint, "canary"), instance_id=self.instance_id)
        decision = await self._send(command, timeout_s)
        if isinstance(decision, Decided) and isinstance(decision.event, CanaryGranted):
            event = decision.event
            return CanaryAnswer(True, event.canary_id, event.expires_at)
        if isinstance(decision, Rejected):
            return CanaryAnswer(False, code=decision.rejection.code, detail=decision.rejection.detail)
        return CanaryAnswer(False, code=UNDECIDED, detail=f"no decision within {timeout_s:g}s")

    async def report_canary(
        self,
        endpoint: str,
        canary_id: str,
        outcome: str,
        duration_ms: int,
        detail: str = "",
        timeout_s: float = 2.0,
    ) -> Decision | None:
        command = ReportCanary(
            **self._header(endpoint, "report"),
            instance_id=self.instance_id,
            canary_id=canary_id,
            outcome=outcome,
            duration_ms=max(0, int(duration_ms)),
            detail=detail[:200],
        )
        return await self._send(command, timeout_s)

    # --- operators (the caller has checked the operator role) -----------------------------------
    # `command_id`: the caller's own id for the command (the API derives it from an
    # Idempotency-Key, so a repeated request is recognised as the same command).

    async def force_open(
        self, endpoint: str, reason: str, actor: str, timeout_s: float = 5.0, *, command_id: str | None = None
    ) -> Decision | None:
        header = self._header(endpoint, "force", actor, command_id=command_id)
        return await self._send(ForceOpenBreaker(**header, reason=reason), timeout_s)

    async def disable(
        self, endpoint: str, reason: str, actor: str, timeout_s: float = 5.0, *, command_id: str | None = None
    ) -> Decision | None:
        header = self._header(endpoint, "disable", actor, command_id=command_id)
        return await self._send(DisableBreaker(**header, reason=reason), timeout_s)

    async def reset(
        self, endpoint: str, reason: str, actor: str, timeout_s: float = 5.0, *, command_id: str | None = None
    ) -> Decision | None:
        header = self._header(endpoint, "reset", actor, command_id=command_id)
        return await self._send(ResetBreaker(**header, reason=reason), timeout_s)

    async def _send(self, command: BreakerCommand, timeout_s: float) -> Decision | None:
        record = breaker_command_record(self._codec, command)
        return await _publish_and_await(
            self._publisher, self._listener, record, command.command_id, timeout_s
        )
