"""Keeps one lease alive from a background thread and fences the runner's effects by it.

The keeper renews every heartbeat interval with a strictly increasing sequence (EXE-4) and
feeds every answer to a CertaintyTracker (certainty.py). The runner goes through the keeper
for everything that depends on the lease:

  send_effect  only while VALID; in JEOPARDY it is refused locally and journaled (LEASE-4)
  checkpoint   allowed in VALID and JEOPARDY (quiescence still checkpoints), journaled
  finish       the terminal report, with the next sequence of the same counter, only while VALID

A stop request (cancel, EXE-7; deadline, EXE-10) arrives on a renewal answer and is surfaced by
`stop_requested`, `wait_for_stop_request` and the `on_stop_requested` callback (called once, with
no keeper lock held); the runner stops and confirms with `finish("cancelled")` (a deadline stop
with `finish("failed", "DEADLINE_EXCEEDED")`), or the run ends `interrupted`, never `cancelled`.

Retries wait the one full-jitter backoff (BRK-3): an unknown renewal is retried after
uniform(0, min(interval, base * 2**k)), the streak reset by the next confirmation;
`finish(..., retries=n)` re-sends an unknown report the same way while the lease lasts.

Renewal and report requests are serialised by one lock, so the coordinator sees their
sequences in the order they were numbered. Effects are not: they are fenced by the epoch at the
gateway (LEASE-3), the local VALID check is the quiescence rule on top. While a terminal
report's outcome is unknown no heartbeat is sent: its retry must keep the report's sequence.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from .backoff import Backoff
from .certainty import (
    TERMINAL_CERTAINTIES,
    Certainty,
    CertaintyTracker,
    JournalEntry,
    JournalKind,
)
from .client import (
    EffectResult,
    Lease,
    RenewalAnswer,
    ReportOutcome,
    TenureClient,
    check_outcome,
)
from .errors import (
    LeaseConflict,
    LeaseInJeopardy,
    LeaseLost,
    LeaseReleased,
    RequestRejected,
    TenureUnavailable,
    ToolFailed,
)

__all__ = ["DEFAULT_RETRY_BASE_S", "LeaseKeeper", "StopRequest"]

log = logging.getLogger("tenure.runner_sdk")

Clock = Callable[[], float]  # local monotonic seconds
DEFAULT_RETRY_BASE_S = 0.1  # BRK-3's T_0 = 100 ms


@dataclass(frozen=True)
class StopRequest:
    """The coordinator asked this runner to stop (EXE-7 cancel, EXE-10 deadline).

    `grace_until` is the coordinator's deadline for the confirmation (epoch ms, its clock);
    `confirm_by` the same deadline as a local `clock()` reading that never overestimates it
    (the renewal's send time plus the grace left when the coordinator answered), None when the
    answer named no grace period. `sequence` is the renewal that carried the request.
    """

    kind: str
    grace_until: int | None
    confirm_by: float | None
    sequence: int
    run_status: str


class _PendingReport(NamedTuple):
    sequence: int
    outcome: ReportOutcome
    error_code: str
    detail: str


class LeaseKeeper:
    """Renews `lease` in a daemon thread (after `start()` or `with`) and guards effects by it.

    `claim_sent_at` is the `clock()` reading taken just BEFORE the claim request was sent; with
    it the lease starts VALID. Without it nothing proves how long the claimed lease still runs,
    so the keeper starts in JEOPARDY and renews at once. `LeaseKeeper.claim(...)` does it right.
    `on_stop_requested` is told of a stop request; `retry_base_s`, `jitter` (a draw in [0, 1))
    and `sleep` are the retries' backoff (BRK-3), injectable so tests can pin the waits.
    """

    def __init__(
        self,
        client: TenureClient,
        lease: Lease,
        clock: Clock = time.monotonic,
        safety_margin_s: float | None = None,
        *,
        claim_sent_at: float | None = None,
        heartbeat_timeout_s: float | None = None,
        heartbeat_interval_s: float | None = None,
        on_stop_requested: Callable[[StopRequest], None] | None = None,
        retry_base_s: float = DEFAULT_RETRY_BASE_S,
        jitter: Callable[[], float] = random.random,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._client = client
        self._lease = lease
        self._clock = clock
        now = clock()
        self._tracker = CertaintyTracker(
            lease.lease_seconds * 1000.0,
            started_at=now * 1000.0,
            safety_margin_ms=None if safety_margin_s is None else safety_margin_s * 1000.0,
        )
        margin_s = self._tracker.safety_margin_ms / 1000.0
        interval = lease.heartbeat_interval_seconds if heartbeat_interval_s is None else heartbeat_interval_s
        if interval <= 0:
            raise ValueError(f"heartbeat interval must be positive, got {interval}")
        if interval >= lease.lease_seconds - margin_s:
            raise ValueError(
                f"heartbeat interval {interval} s leaves no VALID window: lease {lease.lease_seconds} s "
                f"minus safety margin {margin_s:g} s"
            )
        # A renewal that hangs keeps the holder optimistic until it times out; bounding it well
        # under the margin means jeopardy is declared while the proven lease still has time left.
        timeout = min(client.timeout_s, margin_s / 4) if heartbeat_timeout_s is None else heartbeat_timeout_s
        if not 0 < timeout <= margin_s / 2:
            raise ValueError(
                f"heartbeat timeout {timeout:g} s must be positive and at most half the "
                f"safety margin ({margin_s:g} s)"
            )
        if retry_base_s <= 0:
            raise ValueError(f"retry_base_s must be positive, got {retry_base_s}")
        self._interval_s = interval
        self._renewal_timeout_s = timeout
        # BRK-3: one backoff for the renewal's retries; its cap is the regular cadence, so a
        # retry never comes later than the renewal that would have been sent anyway.
        self._retry_base_s = min(retry_base_s, interval)
        self._jitter = jitter
        self._sleep = sleep
        self._renewal_backoff = self._backoff()
        self._on_stop_requested = on_stop_requested
        self._stop_request: StopRequest | None = None
        self._stop_seen = threading.Event()
        self._sequence = 0  # the claim is sequence 0; heartbeats and the report share this counter
        self._last_renewal: RenewalAnswer | None = None
        self._pending_report: _PendingReport | None = None  # sent, outcome unknown
        self._lock = threading.Lock()  # guards the tracker and the counters
        self._wire_lock = threading.Lock()  # one heartbeat/report on the wire at a time, in order
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        if claim_sent_at is None:
            self._next_renewal_at = now
        else:
            self._tracker.renewal_confirmed(
                0, claim_sent_at * 1000.0, lease.expires_at, lease.server_time, now * 1000.0
            )
            self._next_renewal_at = claim_sent_at + interval

    @classmethod
    def claim(
        cls,
        client: TenureClient,
        run_id: str,
        runner_id: str,
        capabilities: Sequence[str],
        lease_seconds: int | None = None,
        heartbeat_seconds: int | None = None,
        *,
        clock: Clock = time.monotonic,
        safety_margin_s: float | None = None,
        idempotency_key: str | None = None,
        heartbeat_timeout_s: float | None = None,
        heartbeat_interval_s: float | None = None,
        on_stop_requested: Callable[[StopRequest], None] | None = None,
        retry_base_s: float = DEFAULT_RETRY_BASE_S,
        jitter: Callable[[], float] = random.random,
        sleep: Callable[[float], None] = time.sleep,
    ) -> LeaseKeeper:
        """Claim an attempt and return its (not yet started) keeper, VALID from the claim on."""
        sent_at = clock()
        lease = client.claim(
            run_id, runner_id, capabilities, lease_seconds, heartbeat_seconds, idempotency_key=idempotency_key
        )
        return cls(
            client,
            lease,
            clock,
            safety_margin_s,
            claim_sent_at=sent_at,
            heartbeat_timeout_s=heartbeat_timeout_s,
            heartbeat_interval_s=heartbeat_interval_s,
            on_stop_requested=on_stop_requested,
            retry_base_s=retry_base_s,
            jitter=jitter,
            sleep=sleep,
        )

    # --- read side ---------------------------------------------------------------------------

    @property
    def lease(self) -> Lease:
        return self._lease

    @property
    def state(self) -> Certainty:
        with self._lock:
            return self._tracker.evaluate(self._now_ms())

    @property
    def valid_until(self) -> float | None:
        """Local clock reading (seconds) until which the lease is proven to live."""
        with self._lock:
            bound = self._tracker.valid_until_local
        return None if bound is None else bound / 1000.0

    @property
    def journal(self) -> tuple[JournalEntry, ...]:
        with self._lock:
            return self._tracker.journal

    @property
    def last_renewal(self) -> RenewalAnswer | None:
        """The last confirmed renewal; its `run_status` tells e.g. that the run is cancelling."""
        with self._lock:
            return self._last_renewal

    @property
    def sequence(self) -> int:
        """The last sequence number used (0 = the claim)."""
        with self._lock:
            return self._sequence

    @property
    def renewal_timeout_s(self) -> float:
        return self._renewal_timeout_s

    @property
    def next_renewal_at(self) -> float:
        """Local clock reading at which the next renewal (or the retry of one) is due."""
        with self._lock:
            return self._next_renewal_at

    @property
    def stop_requested(self) -> bool:
        """True once a renewal answer said the run is to stop (EXE-7/EXE-10); it stays true."""
        return self._stop_seen.is_set()

    @property
    def stop_request(self) -> StopRequest | None:
        with self._lock:
            return self._stop_request

    def wait_for_stop_request(self, timeout_s: float | None = None) -> StopRequest | None:
        """Block until a stop is requested (or `timeout_s` passes); the request, or None."""
        self._stop_seen.wait(timeout_s)
        return self.stop_request

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # --- renewal -----------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the keeper was already started")
        self._thread = threading.Thread(
            target=self._run, name=f"tenure-lease-keeper-{self._lease.attempt_id}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop renewing. This does not release the lease: it expires on the coordinator."""
        self._stopping.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=self._renewal_timeout_s + 5.0)

    def __enter__(self) -> LeaseKeeper:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def renew_once(self) -> Certainty:
        """Send one renewal now and record its answer; the thread calls this on schedule."""
        state, stop = self._renew()
        if stop is not None and self._on_stop_requested is not None:
            # Outside every keeper lock: the callback may well call finish() right away.
            try:
                self._on_stop_requested(stop)
            except Exception:
                log.exception("on_stop_requested of attempt %s failed", self._lease.attempt_id)
        return state

    def _renew(self) -> tuple[Certainty, StopRequest | None]:
        with self._wire_lock:
            with self._lock:
                sent_at_s = self._clock()
                state = self._tracker.evaluate(sent_at_s * 1000.0)
                if state in TERMINAL_CERTAINTIES or self._pending_report is not None:
                    return state, None
                self._sequence += 1
                sequence = self._sequence
                self._tracker.renewal_sent(sequence, sent_at_s * 1000.0)
                self._next_renewal_at = sent_at_s + self._interval_s
            try:
                answer = self._client.heartbeat(self._lease, sequence, timeout_s=self._renewal_timeout_s)
            except LeaseConflict as exc:
                with self._lock:
                    self._tracker.renewal_refused(
                        f"renewal {sequence}: {exc.problem_type}: {exc.detail}", self._now_ms()
                    )
                    return self._tracker.state, None
            except Exception as exc:
                # Whatever went wrong, the renewal may have taken effect: unknown, never refused.
                with self._lock:
                    first = self._renewal_backoff.attempt == 0
                    self._tracker.renewal_unknown(sequence, self._now_ms(), f"{type(exc).__name__}: {exc}")
                    self._schedule_retry()
                if first and not isinstance(exc, TenureUnavailable):
                    log.exception("renewal %d of attempt %s failed oddly", sequence, self._lease.attempt_id)
                elif first:  # one line per streak, not one per retry
                    log.warning(
                        "renewal %d of %s unknown (%s); retrying", sequence, self._lease.attempt_id, exc
                    )
                with self._lock:
                    return self._tracker.state, None
            with self._lock:
                now_ms = self._now_ms()
                if (answer.attempt_id, answer.epoch, answer.sequence) != (
                    self._lease.attempt_id,
                    self._lease.epoch,
                    sequence,
                ):
                    self._tracker.renewal_unknown(
                        sequence,
                        now_ms,
                        f"answer names attempt {answer.attempt_id} epoch {answer.epoch} sequence "
                        f"{answer.sequence}, not the renewal sent",
                    )
                    self._schedule_retry()
                    return self._tracker.state, None
                if self._renewal_backoff.attempt:
                    log.info("renewal %d of attempt %s confirmed again", sequence, self._lease.attempt_id)
                self._renewal_backoff.reset()
                self._last_renewal = answer
                self._tracker.renewal_confirmed(
                    sequence, sent_at_s * 1000.0, answer.expires_at, answer.server_time, now_ms
                )
                return self._tracker.state, self._note_stop(answer, sent_at_s, now_ms)

    def _schedule_retry(self) -> None:
        """After an unknown outcome: retry after a full-jitter wait, capped by the cadence (BRK-3)."""
        retry_at = self._clock() + self._renewal_backoff.next_delay()
        self._next_renewal_at = min(self._next_renewal_at, retry_at)

    def _note_stop(self, answer: RenewalAnswer, sent_at_s: float, now_ms: float) -> StopRequest | None:
        """Record the first stop request a confirmed renewal carries; None if none or not new."""
        if not answer.stop_requested or self._stop_request is not None:
            return None
        grace = answer.stop_grace_until
        # The coordinator read serverTime after the request arrived, i.e. after sent_at: the
        # grace left at serverTime, counted from sent_at, ends no later than the real deadline.
        confirm_by = None if grace is None else sent_at_s + (grace - answer.server_time) / 1000.0
        stop = StopRequest(answer.stop_kind or "stop", grace, confirm_by, answer.sequence, answer.run_status)
        self._stop_request = stop
        self._tracker.record(
            now_ms,
            JournalKind.STOP_REQUESTED,
            f"{stop.kind} stop requested on renewal {stop.sequence}; confirm with a terminal report",
            {"stopKind": stop.kind, "graceUntil": "" if grace is None else str(grace)},
        )
        self._stop_seen.set()
        return stop

    def _run(self) -> None:
        while True:
            with self._lock:
                now = self._clock()
                if self._tracker.evaluate(now * 1000.0) in TERMINAL_CERTAINTIES:
                    return
                # Wake for the next renewal, or when the proven lease runs out, whichever is first.
                lost_at = self._tracker.lost_at_local / 1000.0
                wake_at = lost_at if self._pending_report is not None else min(self._next_renewal_at, lost_at)
            if self._stopping.wait(max(0.0, wake_at - now)):
                return
            with self._lock:
                due = self._clock() >= self._next_renewal_at
            if due:
                self.renew_once()

    # --- fenced actions ----------------------------------------------------------------------

    def send_effect(
        self, idempotency_key: str, tool: str, operation: str, payload: Mapping[str, Any]
    ) -> EffectResult:
        """Perform an effect through the gateway, only if the lease is VALID right now.

        Raises LeaseInJeopardy (nothing sent, journaled), LeaseLost (also when the gateway or the
        tool refuses the epoch), LeaseReleased, or the client's ToolFailed / OutcomeUnknown /
        TenureUnavailable (retry those with the same idempotency key).
        """
        attributes = {"idempotencyKey": idempotency_key, "tool": tool, "operation": operation}
        with self._lock:
            now_ms = self._now_ms()
            self._require_valid("effect", now_ms, JournalKind.EFFECT_REFUSED, attributes)
            self._tracker.record(
                now_ms, JournalKind.EFFECT_ATTEMPTED, f"effect {tool}/{operation} attempted", attributes
            )
        try:
            result = self._client.effect(self._lease, idempotency_key, tool, operation, payload)
        except LeaseConflict as exc:
            with self._lock:
                self._tracker.renewal_refused(
                    f"effect {idempotency_key}: {exc.problem_type}: {exc.detail}", self._now_ms()
                )
            raise LeaseLost("effect", exc.detail, exc.problem_type) from exc
        except (ToolFailed, RequestRejected) as exc:
            self._record(JournalKind.EFFECT_FAILED, f"effect {tool}/{operation} failed: {exc}", attributes)
            raise
        except Exception as exc:
            # OutcomeUnknown, TenureUnavailable, an unreadable 2xx: the effect may have happened.
            self._record(
                JournalKind.EFFECT_UNCERTAIN, f"effect {tool}/{operation} outcome unknown: {exc}", attributes
            )
            raise
        self._record(
            JournalKind.EFFECT_COMMITTED,
            f"effect {tool}/{operation} {result.outcome}",
            {**attributes, "effectId": result.effect_id},
        )
        return result

    def checkpoint(self, digest: str, note: str = "") -> JournalEntry:
        """Journal a checkpoint. Allowed in VALID and JEOPARDY (LEASE-4); refused once lost/released."""
        with self._lock:
            now_ms = self._now_ms()
            state = self._require_not_over("checkpoint", now_ms)
            reason = f"checkpoint {digest} taken in {state.value}" + (f": {note}" if note else "")
            return self._tracker.record(now_ms, JournalKind.CHECKPOINT, reason, {"digest": digest})

    def finish(
        self,
        outcome: ReportOutcome,
        error_code: str = "",
        detail: str = "",
        manifest: Sequence[Mapping[str, Any]] | None = None,
        *,
        retries: int = 0,
    ) -> Mapping[str, Any]:
        """Send the terminal report (next sequence, same fencing as effects) and release the lease.

        `outcome` is succeeded, failed, cancelled (confirms a stop request, EXE-7) or
        preparation_failed (no external effect happened yet, EXE-11; only before the first
        renewal, since the first heartbeat starts the run). Returns the Run view.
        Raises LeaseInJeopardy / LeaseLost / LeaseReleased without sending anything; LeaseLost
        when the coordinator refuses the report; RequestRejected for a definite 4xx (e.g.
        cancelled when no stop was requested), after which the lease is kept; TenureUnavailable
        when its outcome is unknown. Then the report is PENDING: the keeper sends no more
        heartbeats (a higher sequence would make the report's retry look stale) and `finish` with
        the same arguments re-sends it with the SAME sequence, which the coordinator answers
        idempotently; that identical retry is allowed in jeopardy because it makes no new claim.
        With `retries` > 0 the keeper does that itself, up to `retries` times, each after a
        full-jitter wait (BRK-3), and stops with LeaseLost once the proven lease has run out.
        """
        check_outcome(outcome)
        if retries < 0:
            raise ValueError(f"retries must not be negative, got {retries}")
        backoff = self._backoff()
        while True:
            try:
                return self._finish_once(outcome, error_code, detail, manifest)
            except TenureUnavailable:
                if backoff.attempt >= retries:
                    raise
            with self._lock:
                left_s = self._tracker.lost_at_local / 1000.0 - self._clock()
            # Never sleep past the proven lease: the retry after it is refused locally (LOST).
            self._sleep(min(backoff.next_delay(), max(0.0, left_s)))

    def _finish_once(
        self,
        outcome: ReportOutcome,
        error_code: str,
        detail: str,
        manifest: Sequence[Mapping[str, Any]] | None,
    ) -> Mapping[str, Any]:
        report = _PendingReport(0, outcome, error_code, detail)
        attributes = {"outcome": outcome, "errorCode": error_code}
        with self._wire_lock:
            with self._lock:
                now_ms = self._now_ms()
                pending = self._pending_report
                if pending is None:
                    self._require_valid("report", now_ms, JournalKind.REPORT_REFUSED, attributes)
                    self._sequence += 1
                    report = report._replace(sequence=self._sequence)
                    self._pending_report = report
                    what = "sent"
                else:
                    if pending._replace(sequence=0) != report:
                        raise ValueError(
                            f"a different terminal report ({pending.outcome}, sequence {pending.sequence}) "
                            "is pending; retry it with the same arguments"
                        )
                    self._require_not_over("report", now_ms)
                    report = pending
                    what = "re-sent"
                self._tracker.record(
                    now_ms,
                    JournalKind.REPORT_ATTEMPTED,
                    f"terminal report {outcome} {what}",
                    {**attributes, "sequence": str(report.sequence)},
                )
            sequence = report.sequence
            try:
                view = self._client.report(
                    self._lease,
                    sequence,
                    outcome,
                    error_code,
                    detail,
                    manifest=manifest,
                    timeout_s=self._renewal_timeout_s,
                )
            except LeaseConflict as exc:
                with self._lock:
                    self._tracker.renewal_refused(
                        f"report {sequence}: {exc.problem_type}: {exc.detail}", self._now_ms()
                    )
                raise LeaseLost("report", exc.detail, exc.problem_type) from exc
            except RequestRejected:
                # A definite 4xx (validation, auth): nothing was applied, heartbeats may resume.
                with self._lock:
                    self._pending_report = None
                raise
            except Exception as exc:
                with self._lock:
                    self._tracker.renewal_unknown(
                        sequence, self._now_ms(), f"report: {type(exc).__name__}: {exc}"
                    )
                raise
            with self._lock:
                self._pending_report = None
                self._tracker.released(
                    self._now_ms(), f"terminal report {outcome} accepted (sequence {sequence})"
                )
        self.stop()
        return view

    # --- internals ---------------------------------------------------------------------------

    def _now_ms(self) -> float:
        return self._clock() * 1000.0

    def _backoff(self) -> Backoff:
        return Backoff(self._retry_base_s, self._interval_s, self._jitter)

    def _record(self, kind: JournalKind, reason: str, attributes: Mapping[str, str]) -> None:
        with self._lock:
            self._tracker.record(self._now_ms(), kind, reason, attributes)

    def _require_not_over(self, action: str, now_ms: float) -> Certainty:
        """The state at `now_ms`; raises LeaseLost / LeaseReleased when there is no lease any more."""
        state = self._tracker.evaluate(now_ms)
        if state is Certainty.LOST:
            raise LeaseLost(action, self._tracker.last_transition.reason)
        if state is Certainty.RELEASED:
            raise LeaseReleased(action)
        return state

    def _require_valid(
        self, action: str, now_ms: float, refused_kind: JournalKind, attributes: Mapping[str, str]
    ) -> None:
        """Raise unless VALID at `now_ms`; a refusal in jeopardy is journaled as evidence."""
        if self._require_not_over(action, now_ms) is Certainty.VALID:
            return
        why = self._tracker.last_transition.reason
        key = attributes.get("idempotencyKey", "")
        suffix = f" (idempotency key {key})" if key else ""
        self._tracker.record(now_ms, refused_kind, f"{action} refused in jeopardy{suffix}: {why}", attributes)
        raise LeaseInJeopardy(action, why, key)
