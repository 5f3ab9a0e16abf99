"""Stage 2 of a quarantine, confirmed and completed: the quarantine processor's hands.

The takeover itself (the epoch bump) was committed with the trigger (processor.py); what is left
is to see it decided and to make the recipients refuse the old epoch too:
  1. wait until the gateway's fencing of the run shows an epoch above the one quarantined, or no
     lease held (a run that held none has nothing to revoke: the coordinator refused the
     takeover, and the gateway refuses the run's every effect anyway);
  2. fence every recipient the gateway knows (TENURE_TOOLS): a `note` effect under the new epoch
     and the run's work id, so a tool that checks epochs itself (the fenced ledger, the simulated
     environment) refuses whatever the old holder still sends it directly, bypassing the gateway;
     its idempotency key is derived from the run and the epoch, so a re-drive is a replay;
  3. record the stage (RecordQuarantineStage "revoked", idempotent on run and stage).
A crash anywhere in 1-3 leaves the quarantine indexed as owing stage 2; the restore and every
tick hand it here again, and each step is safe to do twice. Every retry waits the one full-jitter
backoff.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from services.common.auth import bearer
from services.common.backoff import Backoff
from services.common.clock import Clock
from services.common.contracts.quarantine import RecordQuarantineStage
from services.common.ids import canonical_json, derived_id
from services.common.kafka import CommandPublisher
from services.common.logs import log_fields
from services.common.messages import MessageCodec
from services.quarantine.domain import AnyState, QuarantineState
from services.quarantine.processor import ACTOR
from services.quarantine.routing import quarantine_command_record

__all__ = ["RevocationExecutor", "fence_key"]

log = logging.getLogger("tenure.quarantine.executor")
_SETTLE_S = 5.0


def fence_key(run_id: str, epoch: int) -> str:
    return f"quarantine-fence/{run_id}/{epoch}"


class RevocationExecutor:
    def __init__(
        self,
        gateway_url: str,
        tools: dict[str, str],
        publisher: CommandPublisher,
        codec: MessageCodec,
        clock: Clock,
        *,
        service_key: str | None = None,
        workers: int = 4,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], object] | None = None,
    ) -> None:
        self._gateway = gateway_url.rstrip("/")
        self._tools = tools
        self._publisher = publisher
        self._codec = codec
        self._clock = clock
        self._http = httpx.Client(timeout=5.0, headers=bearer(service_key), transport=transport)
        # Daemon threads, not a pool: a stage 2 still retrying (the gateway away) must not keep
        # the process alive after SIGTERM; its work is re-driven from the log after a restart.
        self._slots = threading.BoundedSemaphore(workers)
        self._lock = threading.Lock()
        self._in_flight: set[str] = set()
        self._finished: dict[str, float] = {}
        self._stop = threading.Event()
        self._sleep = sleep or self._stop.wait
        self.performed = 0

    def schedule(self, states: Sequence[AnyState]) -> None:
        now = time.monotonic()
        for state in states:
            if not isinstance(state, QuarantineState) or not state.owes_revocation:
                continue
            key = state.quarantine_event_id
            with self._lock:
                if key in self._in_flight or now - self._finished.get(key, -1e9) < _SETTLE_S:
                    continue
                self._in_flight.add(key)
            threading.Thread(target=self._run, args=(state,), name="quarantine-revoke", daemon=True).start()

    def _run(self, state: QuarantineState) -> None:
        backoff = Backoff(0.05, 5.0)
        said = False
        self._slots.acquire()
        try:
            while not self._stop.is_set():
                try:
                    self._revoke(state)
                    self.performed += 1
                    return
                except Exception as exc:  # the gateway or Kafka away: retried, logged once
                    if not said:
                        said = True
                        log.warning(
                            "stage 2 of %s not done yet (%s); retrying",
                            state.run_id,
                            exc,
                            extra=log_fields(run_id=state.run_id),
                        )
                self._sleep(backoff.next_delay())
        finally:
            self._slots.release()
            with self._lock:
                self._in_flight.discard(state.quarantine_event_id)
                self._finished[state.quarantine_event_id] = time.monotonic()

    def _fencing(self, run_id: str) -> dict[str, Any] | None:
        response = self._http.get(f"{self._gateway}/runs/{run_id}/fencing")
        if response.status_code == 404:
            return None
        response.raise_for_status()
        body: dict[str, Any] = response.json()
        return body

    def _revoke(self, state: QuarantineState) -> None:
        poll = Backoff(0.01, 0.5)
        deadline = time.monotonic() + 10.0
        while True:  # 1. the takeover, decided and folded by the gateway
            fencing = self._fencing(state.run_id)
            if fencing is None or not fencing.get("leaseHeld") or int(fencing["epoch"]) > state.lease_epoch:
                break
            if time.monotonic() > deadline:
                raise TimeoutError("the takeover is not in the gateway's fencing yet")
            self._sleep(poll.next_delay())
        epoch = int(fencing["epoch"]) if fencing is not None else 0
        fenced: list[str] = []
        if epoch > 0:  # 2. the recipients refuse the old epoch themselves
            for name, url in sorted(self._tools.items()):
                if self._fence(url, state.run_id, epoch):
                    fenced.append(name)
        detail = {
            "previousEpoch": state.lease_epoch,
            "epoch": epoch,
            "leaseHeld": bool(fencing and fencing.get("leaseHeld")),
            "recipientsFenced": fenced,
            "uploadGrants": "every upload grant of the run is refused from now on",
        }
        stage = RecordQuarantineStage(  # 3. recorded, once
            command_id=derived_id("cmd", state.quarantine_event_id, "revoked"),
            run_id=state.run_id,
            issued_at=self._clock.now_ms(),
            correlation_id=state.run_id,
            actor=ACTOR,
            stage="revoked",
            mechanism="lease-takeover",
            completed_at=self._clock.now_ms(),
            host_id=ACTOR,
            detail=canonical_json(detail),
        )
        self._publisher.publish(quarantine_command_record(self._codec, stage)).result(30)

    def _fence(self, url: str, run_id: str, epoch: int) -> bool:
        """True when the recipient took the new epoch (any answer but a transport failure or a
        5xx: a refusal of the note itself still raised its bar, as both reference tools do)."""
        try:
            response = self._http.post(
                f"{url}/effects",
                headers={
                    "Idempotency-Key": fence_key(run_id, epoch),
                    "X-Fencing-Epoch": str(epoch),
                    "X-Work-Id": run_id,
                },
                json={"operation": "note", "payload": {"quarantine": run_id, "epoch": epoch}},
            )
        except httpx.HTTPError as exc:
            log.warning("could not fence %s for %s: %s", url, run_id, exc, extra=log_fields(run_id=run_id))
            return False
        return response.status_code < 500

    def close(self) -> None:
        self._stop.set()
        self._http.close()
