"""The saga's hands: performs what `pending_work` says through the effect gateway, reports back.

The executor owns nothing. It reads a trajectory's state after each committed batch (and on a
periodic rescan), performs the one piece of work the state calls for, and publishes the result
as a command on trajectories.commands, which the processor decides like any other. A crash
anywhere here loses nothing: the state still calls for the same work, which is done again under
the same idempotency key, and the gateway and the recipient turn the repeat into "already done".

A refusal by the gateway's tool protection (`circuit-open` ERR_CIRCUIT_OPEN, `bulkhead-full`
ERR_BULKHEAD_FULL: nothing was recorded or sent) is passed on to policy D for a forward step,
with the wait the gateway named (`retryAfterMs`, the cooldown remaining) at the head of the error
message, where D reads it (domain.policy `deferral_message`). A compensator, a pivot gate's
verifier, or a step whose key holds an unsettled effect (`pendingIntent`, or answers lost
before) is not reported: the executor waits that long plus a full-jitter draw and tries the same
work again, so no attempt is counted and no key is given up for a refusal.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence
from urllib.parse import quote

import httpx

from services.common.auth import bearer
from services.common.backoff import Backoff
from services.common.clock import Clock
from services.common.contracts import (
    RecordCompensationOutcome,
    RecordLeaseRevocation,
    RecordPivotGate,
    RecordStepOutcome,
    TakeOverLease,
    TrajectoryCommand,
)
from services.common.ids import canonical_json, derived_id
from services.common.kafka import CommandPublisher
from services.common.messages import MessageCodec
from services.common.routing import command_record, trajectory_command_record
from services.common.tracing import Context, SpanKind, inject_into_http, recall, span
from services.saga_orchestrator.domain import (
    DEFERRAL_KINDS,
    DispatchStep,
    ErrorClass,
    EvaluateGate,
    RevokeLease,
    RunCompensator,
    StepError,
    ToolCatalog,
    TrajectoryState,
    Work,
    classify,
    deferral_message,
    pending_work,
)

__all__ = ["ACTOR", "BACKOFF_BASE_S", "BACKOFF_CAP_S", "GatewayHealth", "SagaExecutor"]

log = logging.getLogger("tenure.saga_orchestrator.executor")
ACTOR = "tenure-saga-orchestrator"
# Every retry of a piece of work waits a full-jitter backoff (BRK-3): with 16 workers retrying
# a gateway that is down, a fixed wait would make them all knock at once, forever.
BACKOFF_BASE_S = 0.1
BACKOFF_CAP_S = 10.0
# A finished piece of work is not started again by a rescan for this long: its report is on its
# way through the command topic, and redoing it would only produce a replayed answer.
_SETTLE_S = 5.0


class _RetryLater(Exception):
    """No answer that decides anything (outcome still unknown, fenced out): try again later."""


class _Deferred(_RetryLater):
    """The gateway's tool protection refused the call (nothing was sent): try again after
    `retry_after_s` (the cooldown remaining) plus the loop's full-jitter backoff."""

    def __init__(self, message: str, retry_after_ms: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_ms / 1000


class _GatewayUnusable(_RetryLater):
    """The gateway did not answer, is not ready, or refuses our key: an expected, shared state."""


class GatewayHealth:
    """Whether the gateway is usable, shared by every worker: one log line per change of state.

    While the gateway is down every worker keeps retrying; logging each try (with a traceback)
    drowned the log. Only the transitions are news: unusable (a warning, with the reason) and
    usable again (an info line).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._usable = True

    @property
    def usable(self) -> bool:
        return self._usable

    def failed(self, reason: str) -> None:
        with self._lock:
            changed, self._usable = self._usable, False
        if changed:
            log.warning("the effect gateway is unusable: %s; retrying with backoff", reason)

    def answered(self) -> None:
        with self._lock:
            changed, self._usable = not self._usable, True
        if changed:
            log.info("the effect gateway answers again")


# Refusals that mean "this lease no longer rules the run". Its new holder adopts the trajectory
# (AdoptLease) and the work is redone under the new epoch, so they are not the step's failure,
# unless no new holder shows up for _FENCED_GRACE_S.
_FENCED_KINDS = frozenset(
    {
        "stale-epoch",
        "fenced-by-recipient",
        "lease-revoked",
        "lease-expired",
        "lease-released",
        "unknown-attempt",
    }
)
_FENCED_GRACE_S = 30.0


def _fenced(command: TrajectoryCommand | None) -> bool:
    kind = getattr(command, "error_kind", "")
    return kind in _FENCED_KINDS


def _attributes(work: Work) -> dict[str, Any]:
    """A piece of work's span attributes: its run, attempt, epoch, step and key."""
    return {
        "tenure.run.id": work.run_id,
        "tenure.attempt.id": getattr(work, "attempt_id", None),
        "tenure.epoch": getattr(work, "epoch", None),
        "tenure.step.index": getattr(work, "step_index", None),
        "tenure.work.key": work.key,
    }


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {"raw": response.text[:500]}
    return body if isinstance(body, dict) else {}


def _http_status(value: object, fallback: int) -> int:
    """An HTTP status from an answer's body, or `fallback`: never a ValueError or an int the
    event schema cannot carry."""
    return (
        value if isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599 else fallback
    )


def _slug(problem: dict[str, Any] | None, fallback: str) -> str:
    value = str((problem or {}).get("type") or "")
    return value.rsplit("/", 1)[-1] or fallback


# The longest wait a refusal may ask for: a breaker's cooldown is bounded by the breakers'
# settings (at most an hour); anything larger, or not an integer, is not taken as given.
_MAX_RETRY_AFTER_MS = 3_600_000


def _deferral(status: int, body: dict[str, Any]) -> tuple[str, int] | None:
    """(kind, wait in ms) when the gateway's tool protection refused the call, else None."""
    kind = _slug(body, "")
    if status not in (424, 429) or kind not in DEFERRAL_KINDS:
        return None
    wait = body.get("retryAfterMs")
    if not isinstance(wait, int) or isinstance(wait, bool) or not 0 <= wait <= _MAX_RETRY_AFTER_MS:
        wait = 0
    return kind, wait


class SagaExecutor:
    """`service_key` is presented to the gateway on every call (the service role acts for any
    trajectory); `transport`, `sleep` and `draw` exist for tests."""

    def __init__(
        self,
        gateway_url: str,
        publisher: CommandPublisher,
        codec: MessageCodec,
        catalog: ToolCatalog,
        clock: Clock,
        *,
        workers: int = 16,
        http_timeout_s: float = 30.0,
        revoke_wait_s: float = 10.0,
        service_key: str | None = None,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], object] | None = None,
        draw: Callable[[], float] | None = None,
    ) -> None:
        self._gateway = gateway_url.rstrip("/")
        self._publisher = publisher
        self._codec = codec
        self._catalog = catalog
        self._clock = clock
        self._http = httpx.Client(timeout=http_timeout_s, headers=bearer(service_key), transport=transport)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="saga-work")
        self._lock = threading.Lock()
        self._in_flight: set[str] = set()
        self._finished: dict[str, float] = {}
        self._stop = threading.Event()
        self._sleep = sleep or self._stop.wait
        self._draw = draw
        self._revoke_wait_s = revoke_wait_s
        self.gateway_health = GatewayHealth()
        self.performed = 0

    # --- scheduling ---------------------------------------------------------------------------

    def schedule(self, states: Sequence[TrajectoryState]) -> None:
        now = time.monotonic()
        for state in states:
            work = pending_work(state)
            if work is None:
                continue
            with self._lock:
                if work.key in self._in_flight or now - self._finished.get(work.key, -1e9) < _SETTLE_S:
                    continue
                self._in_flight.add(work.key)
            # The work continues the trace of the decision that called for it (issue 17).
            self._pool.submit(self._run, work, recall(state.run_id))

    def _backoff(self, base_s: float = BACKOFF_BASE_S, cap_s: float = BACKOFF_CAP_S) -> Backoff:
        return Backoff(base_s, cap_s) if self._draw is None else Backoff(base_s, cap_s, self._draw)

    def _run(self, work: Work, parent: Context | None = None) -> None:
        fenced_since: float | None = None
        backoff = self._backoff()  # one per loop: Backoff is not thread-safe
        said: set[str] = set()  # what this loop has already logged, so a retry is not news
        try:
            while not self._stop.is_set():
                try:
                    self._wait_until(getattr(work, "not_before", 0))
                    with span(f"saga {type(work).__name__}", _attributes(work), parent=parent):
                        command = self._perform(work)
                        if _fenced(command):
                            fenced_since = fenced_since or time.monotonic()
                            if time.monotonic() - fenced_since < _FENCED_GRACE_S:
                                raise _RetryLater(
                                    "fenced out: waiting for the new lease holder to adopt the trajectory"
                                )
                        if command is not None:
                            self._report(command)
                    self.performed += 1
                    return
                except _GatewayUnusable:
                    pass  # GatewayHealth logged the change of state, if it was one
                except _Deferred as exc:
                    if str(exc) not in said:
                        said.add(str(exc))
                        log.info("%s: %s; retrying after the wait plus full jitter", work.key, exc)
                    self._sleep(exc.retry_after_s + backoff.next_delay())
                    continue
                except _RetryLater as exc:
                    if str(exc) not in said:
                        said.add(str(exc))
                        log.info("%s: %s; retrying with backoff", work.key, exc)
                except Exception as exc:
                    # Unforeseen (or Kafka refusing the report): the traceback once per piece of
                    # work, then quietly, with the same backoff.
                    kind = type(exc).__name__
                    if kind not in said:
                        said.add(kind)
                        log.exception("work %s failed; retrying with backoff", work.key)
                self._sleep(backoff.next_delay())
        finally:
            with self._lock:
                self._in_flight.discard(work.key)
                self._finished[work.key] = time.monotonic()
                if len(self._finished) > 50_000:
                    cutoff = time.monotonic() - _SETTLE_S
                    self._finished = {k: t for k, t in self._finished.items() if t > cutoff}

    def _report(self, command: TrajectoryCommand) -> None:
        record = trajectory_command_record(self._codec, command)
        try:
            self._publisher.publish(record).result(30)
        except Exception as exc:  # Kafka away: an expected outage, retried like the gateway's
            raise _RetryLater(
                f"could not publish {type(command).__name__} ({type(exc).__name__}: {exc})"
            ) from exc

    def _wait_until(self, not_before_ms: int) -> None:
        delay = (not_before_ms - self._clock.now_ms()) / 1000
        if delay > 0:
            self._stop.wait(delay)

    def _perform(self, work: Work) -> TrajectoryCommand | None:
        if isinstance(work, DispatchStep):
            return self._dispatch(work)
        if isinstance(work, RunCompensator):
            return self._compensate(work)
        if isinstance(work, EvaluateGate):
            return self._gate(work)
        return self._revoke(work)

    # --- the gateway --------------------------------------------------------------------------

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One request to the gateway; raises _GatewayUnusable when its answer decides nothing."""
        try:
            attributes = {"http.request.method": method, "url.path": path}
            with span(f"{method} gateway", attributes, kind=SpanKind.CLIENT):
                response = self._http.request(
                    method, f"{self._gateway}{path}", headers=inject_into_http(), **kwargs
                )
        except httpx.HTTPError as exc:
            self.gateway_health.failed(f"{type(exc).__name__}: {exc}")
            raise _GatewayUnusable(f"gateway unreachable: {exc}") from exc
        if response.status_code == 503:
            self.gateway_health.failed("it answers 503 (not ready, or Kafka is away)")
            raise _GatewayUnusable("the gateway is not ready")
        if response.status_code == 401 or _slug(_json(response), "") == "forbidden":
            # Our own key is wrong: no step's fault, and fixed by configuration, not by waiting out.
            self.gateway_health.failed(
                f"it refuses our key ({response.status_code}): set TENURE_SERVICE_KEY to a key of a "
                "principal with the service role in TENURE_API_KEYS"
            )
            raise _GatewayUnusable(f"the gateway answered {response.status_code}")
        self.gateway_health.answered()
        return response

    def _effect(
        self,
        run_id: str,
        attempt_id: str,
        epoch: int,
        key: str,
        tool: str,
        operation: str,
        payload: dict[str, Any],
        action_hash: str = "",
    ) -> tuple[int, dict[str, Any]]:
        body: dict[str, Any] = {
            "runId": run_id,
            "attemptId": attempt_id,
            "epoch": epoch,
            "idempotencyKey": key,
            "tool": tool,
            "operation": operation,
            "payload": payload,
        }
        if action_hash:
            body["actionHash"] = action_hash  # a tombstoned step is refused at the gateway too
        response = self._call("POST", "/effects", json=body)
        return response.status_code, _json(response)

    def _dispatch(self, work: DispatchStep) -> RecordStepOutcome:
        status, body = self._effect(
            work.run_id,
            work.attempt_id,
            work.epoch,
            work.idempotency_key,
            work.gateway_tool,
            work.operation,
            work.params,
            work.action_hash,
        )
        fields: dict[str, Any] = {}
        deferral = _deferral(status, body)
        if deferral is not None:
            kind, wait_ms = deferral
            detail = str(body.get("detail") or kind)
            if body.get("pendingIntent") is True or work.unknown_outcomes:
                # An earlier try under this key may have happened: keep the key, report nothing.
                raise _Deferred(f"{kind} (the key holds an unsettled effect): {detail}", wait_ms)
            fields = {
                "outcome": "failed",
                "error_kind": kind,
                "error_message": deferral_message(detail, wait_ms),
                "error_status": status,
            }
        elif status == 200 and body.get("outcome") == "committed":
            response = body.get("toolResponse")
            if not isinstance(response, dict) or "raw" in response:
                # Committed, but the answer is missing or garbled: asking again under the same key
                # makes the gateway fetch the recipient's stored result.
                raise _RetryLater("the effect committed but its result is not available yet")
            fields = {
                "outcome": "committed",
                "output": canonical_json(response.get("output", response)),
                "reconciled": bool(body.get("reconciled")),
            }
        elif status == 200:
            # A failure recorded before a crash, whose answer is lost. A definite failure had no
            # effect, so the retry under a new key that a transient error leads to is safe.
            fields = {
                "outcome": "failed",
                "error_kind": "answer-lost",
                "error_status": 503,
                "error_message": "the gateway recorded a failure whose answer was lost",
            }
        elif status == 504:
            fields = {"outcome": "unknown", "error_message": str(body.get("detail", "outcome unknown"))}
        else:
            problem = body.get("toolResponse") if status == 502 else body
            problem = problem if isinstance(problem, dict) else {}
            partial = problem.get("partialOutput")
            fields = {
                "outcome": "failed",
                "error_kind": _slug(problem, "tool-failed"),
                "error_message": str(problem.get("detail") or body.get("detail") or ""),
                "error_status": _http_status(body.get("toolStatus"), status),
                "partial_output": canonical_json(partial) if isinstance(partial, dict) else "",
            }
        cause = derived_id("cmd", work.key, fields["outcome"])
        return RecordStepOutcome(
            **self._header(work.run_id, cause),
            step_index=work.step_index,
            dispatch=work.dispatch,
            lease_epoch=work.epoch,
            **fields,
        )

    def _compensate(self, work: RunCompensator) -> RecordCompensationOutcome:
        if not work.operation:
            # No compensator could be bound from the step's output: only a human can undo it.
            return RecordCompensationOutcome(
                **self._header(work.run_id, derived_id("cmd", work.key, "unbound")),
                step_index=work.step_index,
                attempt=work.attempt,
                outcome="fatal",
                error_kind="compensator-unbound",
                error_message="no compensator was bound from this step's output",
                lease_epoch=work.epoch,
            )
        status, body = self._effect(
            work.run_id,
            work.attempt_id,
            work.epoch,
            work.idempotency_key,
            work.gateway_tool,
            work.operation,
            work.params,
        )
        deferral = _deferral(status, body)
        if deferral is not None:
            # Nothing was sent: the compensator waits, and the attempt is not spent on it.
            raise _Deferred(f"compensator {deferral[0]}: {body.get('detail', '')}", deferral[1])
        if status == 200 and body.get("outcome") == "committed":
            outcome, kind, message = "compensated", "", ""
        elif status == 504:
            raise _RetryLater("the compensator's outcome is unknown; the gateway reconciles on the next try")
        else:
            problem = body.get("toolResponse") if status == 502 else body
            problem = problem if isinstance(problem, dict) else {}
            kind = _slug(problem, "answer-lost" if status == 200 else "tool-failed")
            message = str(problem.get("detail") or body.get("detail") or "")
            tool_status = _http_status(body.get("toolStatus"), 503 if status == 200 else status)
            transient = (
                classify(StepError(kind, work.operation, message, tool_status)) is ErrorClass.TRANSIENT
            )
            outcome = "retriable" if transient else "fatal"
        cause = derived_id("cmd", work.key, outcome)
        return RecordCompensationOutcome(
            **self._header(work.run_id, cause),
            step_index=work.step_index,
            attempt=work.attempt,
            outcome=outcome,
            error_kind=kind,
            error_message=message,
            lease_epoch=work.epoch,
        )

    def _fencing(self, run_id: str) -> dict[str, Any] | None:
        response = self._call("GET", f"/runs/{quote(run_id, safe='')}/fencing")
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise _RetryLater(f"gateway answered {response.status_code}")
        body = _json(response)
        if "raw" in body:
            raise _RetryLater("the gateway's fencing answer is not JSON")
        return body

    def _gate(self, work: EvaluateGate) -> RecordPivotGate:
        """SAGA-6's deterministic pre-pivot gate: the lease, then every registered verifier."""
        checks: list[dict[str, Any]] = []
        fencing = self._fencing(work.run_id)
        held = fencing is not None and bool(fencing.get("leaseHeld")) and fencing.get("epoch") == work.epoch
        checks.append(
            {
                "name": "lease-active",
                "passed": held,
                "detail": f"gateway sees epoch {fencing.get('epoch') if fencing else None}, "
                f"held={fencing.get('leaseHeld') if fencing else None}; trajectory epoch {work.epoch}",
            }
        )
        spec = self._catalog.get(work.tool)
        for verifier in spec.verifiers:
            response = self._call(
                "POST",
                "/verify",
                json={
                    "runId": work.run_id,
                    "tool": spec.gateway_tool,
                    "verifier": verifier,
                    "payload": work.params,
                },
            )
            if response.status_code >= 500:
                raise _RetryLater(f"verifier {verifier} answered {response.status_code}")
            deferral = _deferral(response.status_code, _json(response))
            if deferral is not None:  # the gate is not failed by a verifier that was not run
                raise _Deferred(f"verifier {verifier}: {deferral[0]}", deferral[1])
            result = _json(response).get("result", {}) if response.status_code == 200 else {}
            result = result if isinstance(result, dict) else {}
            checks.append(
                {
                    "name": verifier,
                    "passed": bool(result.get("ok")),
                    "detail": str(result.get("detail") or response.text[:300]),
                }
            )
        cause = derived_id("cmd", work.key)
        return RecordPivotGate(
            **self._header(work.run_id, cause), step_index=work.step_index, checks=canonical_json(checks)
        )

    def _revoke(self, work: RevokeLease) -> RecordLeaseRevocation:
        """REC-7, WD-5: revoke the run's lease (a takeover bumps the epoch, fencing the runner out)."""
        takeover = TakeOverLease(
            **self._header(work.run_id, derived_id("cmd", work.incident_id, "revoke")),
            reason=work.reason,
            new_holder=ACTOR,
            holder_kind="runner",
        )
        self._publisher.publish(command_record(self._codec, takeover)).result(30)
        deadline = time.monotonic() + self._revoke_wait_s
        poll = self._backoff(0.05, 1.0)  # waiting for a decision, not hammering the gateway
        while True:
            fencing = self._fencing(work.run_id)
            if fencing is None:
                break
            epoch = fencing.get("epoch")
            if not isinstance(epoch, int):
                raise _RetryLater(f"the gateway's fencing answer has no epoch: {fencing}")
            if epoch > work.epoch or not fencing.get("leaseHeld"):
                break
            if time.monotonic() > deadline:
                raise _RetryLater("the takeover has not been decided yet")
            self._sleep(poll.next_delay())
        return RecordLeaseRevocation(
            **self._header(work.run_id, derived_id("cmd", work.key, "recorded")),
            incident_id=work.incident_id,
            revoked_epoch=work.epoch,
        )

    def _header(self, run_id: str, command_id: str) -> dict[str, Any]:
        return {
            "command_id": command_id,
            "run_id": run_id,
            "issued_at": self._clock.now_ms(),
            "correlation_id": run_id,
            "actor": ACTOR,
        }

    def close(self) -> None:
        self._stop.set()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._http.close()
