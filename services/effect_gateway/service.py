"""The gateway's moving parts: the follower of runs.events and watchdog.events, and the effect protocol.

Protocol for one effect (numbered, because a crash can cut it anywhere):
  1. Refuse at once if the run's epoch, as folded from the log, is above the caller's, or if
     the effect's action is tombstoned for the run by the semantic watchdog (WD-5 level 2,
     ACTION_TOMBSTONED): nothing is recorded, nothing is sent. An effect the log already
     records as settled is answered as before (nothing is dispatched for it).
  2. Record the intent through the coordinator (RecordEffectIntent): the coordinator checks the
     attempt and epoch against the lease it owns, so a holder replaced by a takeover is refused
     even if this gateway has not yet seen the takeover. Nothing is sent before this is durable.
  3. If an intent for this idempotency key already existed, reconcile first: probe the tool.
  4. Dispatch with the idempotency key and the epoch; the tool checks the epoch too.
  5. On a timeout or a 5xx, probe with the same key before any re-dispatch (REC-6): found means
     committed; absent after a 5xx answer means that answer was a definite failure; absent after
     no answer means one more dispatch with the same key; still nothing means "unknown".
  6. Record the outcome (committed / failed / unknown) through the coordinator.

Tool protection (services/effect_gateway/protection.py, BRK-1/2/4) sits between 1 and 2: an
effect whose tool's circuit breaker is open, or whose bulkhead is full, is refused before its
intent is recorded (`circuit-open` ERR_CIRCUIT_OPEN, `bulkhead-full` ERR_BULKHEAD_FULL), and
every call of 3-5 is bounded by the bulkhead's timeout and reported to the breaker. The canary
of a half-open breaker is one call: if it fails, the effect's outcome is left "unknown" for the
next try under the same key to reconcile, instead of probing an endpoint that just failed again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from services.breakers.client import BreakerClient
from services.breakers.view import BreakerBoard
from services.common.auth import Principal
from services.common.bulkhead import BulkheadFull, Bulkheads
from services.common.clock import SystemClock
from services.common.contracts import (
    BREAKER_EVENT_TYPES,
    EVENT_TYPES,
    InterventionIssued,
    RecordEffectIntent,
    RecordEffectOutcome,
)
from services.common.decisions import DecisionListener, Rejected, publish_and_await
from services.common.feed import TopicFeed
from services.common.ids import derived_id
from services.common.kafka import CommandPublisher
from services.common.messages import MessageCodec
from services.common.routing import command_record
from services.common.settings import TenureSettings
from services.common.topics import BREAKERS_EVENTS, BREAKERS_REJECTIONS, RUNS_EVENTS, WATCHDOG_EVENTS
from services.common.tracing import annotate
from services.effect_gateway.egress import parse_tool_egress
from services.effect_gateway.fencing import (
    FencingView,
    Refusal,
    authorize_effect,
    authorize_verify,
    effect_action_hashes,
    fold_fencing,
    fold_tombstones,
    tombstoned_action,
)
from services.effect_gateway.protection import CircuitOpen, Guarded, ToolProtection
from services.effect_gateway.quarantine_guard import QuarantineGuard
from services.effect_gateway.refusals import EffectRefused, bulkhead_full_problem, circuit_open_problem
from services.effect_gateway.tools import ToolAnswer, ToolRegistry, ToolUnreachable
from services.quarantine.view import QuarantineBoard

__all__ = [
    "CATCH_UP_WAIT_S",
    "COORDINATOR_REFUSALS",
    "EffectRefused",
    "EffectRequest",
    "EffectResult",
    "Gateway",
    "bulkhead_full_problem",
    "circuit_open_problem",
    "effect_id_for",
    "instance_id_for",
]

log = logging.getLogger("tenure.effect_gateway")
ACTOR = "tenure-effect-gateway"
# How long a request waits for the fold to show a lease it names and the gateway has not seen
# yet: a runner may call the gateway the moment its claim is answered, before this follower has
# read the AttemptClaimed. Short, because it only covers the follower's lag.
CATCH_UP_WAIT_S = 2.0
# What the follower folds: the leases (fencing) and the watchdog's interventions (tombstones).
FOLLOWED = (RUNS_EVENTS.name, WATCHDOG_EVENTS.name)
# The coordinator's refusals of an intent that the gateway passes on as they are (409).
COORDINATOR_REFUSALS = frozenset(
    {"stale-epoch", "unknown-attempt", "lease-expired", "lease-revoked", "lease-released", "run-not-found"}
)


def _check(ok: bool, detail: str) -> dict[str, Any]:
    return {"ok": ok, "detail": detail}


def effect_id_for(run_id: str, idempotency_key: str) -> str:
    return derived_id("eff", run_id, idempotency_key)


def instance_id_for(settings: TenureSettings) -> str:
    """This gateway process to the breakers: the canary slot's holder and the outcomes' source.

    The host and the process id are part of it, so two gateways left at the default
    TENURE_INSTANCE_ID never pass for one (their outcome numbers would shadow each other's)."""
    return f"gw-{settings.instance_id}@{socket.gethostname()}:{os.getpid()}"[:128]


@dataclass(frozen=True)
class EffectRequest:
    run_id: str
    attempt_id: str
    epoch: int
    idempotency_key: str
    tool: str
    operation: str
    payload: dict[str, Any]
    # The action hash the caller names the effect by (WD-4; the saga sends its step's), or "".
    action_hash: str = ""


@dataclass(frozen=True)
class EffectResult:
    effect_id: str
    outcome: str
    tool_status: int | None
    tool_response: dict[str, Any] | None
    reconciled: bool
    replayed: bool = False


def _refused(refusal: Refusal, **extensions: Any) -> EffectRefused:
    return EffectRefused(refusal.slug, refusal.detail, **extensions)


class Gateway:
    """`bulkheads` None: from the settings (the registry's connection pool should be sized from
    the same, see __main__)."""

    def __init__(
        self,
        bootstrap_servers: str,
        tools: ToolRegistry,
        decision_timeout_s: float = 5.0,
        *,
        settings: TenureSettings | None = None,
        bulkheads: Bulkheads | None = None,
    ) -> None:
        settings = settings or TenureSettings()
        self._codec = MessageCodec()
        self._clock = SystemClock()
        self._tools = tools
        self._timeout = decision_timeout_s
        self._views: dict[str, FencingView] = {}
        self._tombstones: dict[str, frozenset[str]] = {}
        self._lock = threading.Lock()
        self._publisher = CommandPublisher(bootstrap_servers, client_id="tenure-effect-gateway")
        self._decisions = DecisionListener(bootstrap_servers, self._codec)
        # The breakers (BRK-2): their state folded here from breakers.events, and a client that
        # reports outcomes and asks for canaries through this gateway's own publisher.
        self._board = BreakerBoard(bootstrap_servers, self._codec, client_id="tenure-gateway-breakers")
        self._breaker_decisions = DecisionListener(
            bootstrap_servers,
            self._codec,
            topics=(BREAKERS_EVENTS.name, BREAKERS_REJECTIONS.name),
            event_types=BREAKER_EVENT_TYPES,
            client_id="tenure-gateway-breaker-decisions",
        )
        client = BreakerClient(
            self._publisher,
            self._breaker_decisions,
            instance_id_for(settings),
            actor=ACTOR,
            codec=self._codec,
        )
        self._protection = ToolProtection(
            self._board,
            client,
            bulkheads or Bulkheads.from_settings(settings),
            tool_timeout_s=settings.tool_timeout_s,
            slow_call_ms=settings.breaker_slow_call_ms,
        )
        # QUA-1: quarantined runs (folded from quarantine.events) and the egress allowlists.
        self._quarantine = QuarantineGuard(
            QuarantineBoard(bootstrap_servers, self._codec, client_id="tenure-gateway-quarantine"),
            self._publisher,
            self._codec,
            parse_tool_egress(settings.tool_egress),
            publish_timeout_s=decision_timeout_s,
        )
        # The fencing fold (runs.events) and the watchdog's tombstones, from the beginning.
        self._feed = TopicFeed(
            bootstrap_servers,
            FOLLOWED,
            (*EVENT_TYPES, InterventionIssued),
            self._fold,
            what="gateway",
            client_id="tenure-gateway",
            codec=self._codec,
        )

    # --- following the log --------------------------------------------------------------------

    def _fold(self, event: Any) -> None:
        if isinstance(event, InterventionIssued):
            self.tombstone(event)
            return
        with self._lock:
            self._views[event.run_id] = fold_fencing(self._views.get(event.run_id), event)
        self._quarantine.fold_run(event)

    def tombstone(self, event: InterventionIssued) -> None:
        """Fold one of the watchdog's interventions (WD-5): level 2 and 3 tombstone an action."""
        with self._lock:
            before = self._tombstones.get(event.run_id, frozenset())
            self._tombstones[event.run_id] = fold_tombstones(before, event)

    def tombstones(self, run_id: str) -> frozenset[str]:
        with self._lock:
            return self._tombstones.get(run_id, frozenset())

    @property
    def ready(self) -> bool:
        """Caught up with runs.events and watchdog.events: the fold may be trusted to refuse a
        stale epoch and a tombstoned action."""
        return self._feed.current

    def readiness(self) -> dict[str, dict[str, Any]]:
        """What /readyz reports, {check: {"ok", "detail"}}; ready when every check is ok.

        Blocks for up to half a second when the broker does not answer (call it off the loop)."""
        following = self._feed.running and self._feed.failure is None
        unreachable = self._publisher.reachable()
        decisions = self._decisions.health()
        board = self._board.health()
        breaker_decisions = self._breaker_decisions.health()
        quarantine = self._quarantine.fold.health()
        return {
            "caughtUp": _check(self.ready, f"{' and '.join(FOLLOWED)} read to their end as of start-up"),
            "following": _check(following, self._feed.failure or f"following {', '.join(FOLLOWED)}"),
            "kafka": _check(unreachable is None, unreachable or "the publisher reaches a broker"),
            "decisions": _check(decisions.ready, decisions.detail),
            "breakers": _check(board.ready, board.detail),
            "breakerDecisions": _check(breaker_decisions.ready, breaker_decisions.detail),
            "quarantine": _check(quarantine.ready, quarantine.detail),
        }

    @property
    def protection(self) -> ToolProtection:
        return self._protection

    def tool_names(self) -> list[str]:
        return self._tools.names()

    def view(self, run_id: str) -> FencingView | None:
        with self._lock:
            return self._views.get(run_id)

    async def _view_showing(self, run_id: str, attempt_id: str, epoch: int) -> FencingView | None:
        """The run's view once it shows `attempt_id` or `epoch`, or as it is after a short wait."""
        deadline = time.monotonic() + CATCH_UP_WAIT_S
        while True:
            view = self.view(run_id)
            if view is not None and (attempt_id in view.holders or epoch <= view.epoch):
                return view
            if time.monotonic() >= deadline:
                return view
            await asyncio.sleep(0.02)

    # --- the protocol -------------------------------------------------------------------------

    async def perform(self, request: EffectRequest, caller: Principal | None = None) -> EffectResult:
        """Perform `request` for `caller` (None: development mode, nothing authenticated)."""
        annotate(
            {
                "tenure.run.id": request.run_id,
                "tenure.attempt.id": request.attempt_id,
                "tenure.epoch": request.epoch,
                "tenure.tool": request.tool,
                "tenure.operation": request.operation,
                "tenure.idempotency_key": request.idempotency_key,
            }
        )
        if not self.ready:
            raise EffectRefused("unavailable", "the gateway is still reading the lease log")
        if not self._tools.knows(request.tool):
            raise EffectRefused("unknown-tool", f"no tool {request.tool!r}; known: {self._tools.names()}")
        view = await self._view_showing(request.run_id, request.attempt_id, request.epoch)
        if view is None:
            raise EffectRefused("run-not-found", f"run {request.run_id} does not exist", runId=request.run_id)
        self._quarantine.refuse_quarantined(request.run_id)  # QUA-1: whatever the epoch
        refusal = authorize_effect(caller, view, request.attempt_id, request.epoch)
        if refusal is not None:  # commit-time authorization (LEASE-1): nothing is recorded
            log.warning(
                "effect refused: %s",
                refusal.detail,
                extra={"fields": {"runId": request.run_id, "reason": refusal.slug}},
            )
            raise _refused(refusal, runId=request.run_id, currentEpoch=view.epoch)
        if request.epoch < view.epoch:  # step 1
            raise EffectRefused(
                "stale-epoch",
                f"epoch {request.epoch} is stale: run {request.run_id} is at epoch {view.epoch}",
                runId=request.run_id,
                currentEpoch=view.epoch,
            )
        effect_id = effect_id_for(request.run_id, request.idempotency_key)
        known = view.effects.get(effect_id)
        if known not in ("committed", "failed"):
            # An effect already settled is answered as it was below; anything else would be a
            # new dispatch of the action, which a tombstone forbids (WD-5 level 2).
            self._refuse_tombstoned(request)
            # QUA-1: an effect aimed outside the egress allowlist is refused before dispatch, and
            # the same decision starts the run's quarantine.
            await self._quarantine.check_egress(
                view,
                request.tool,
                request.operation,
                request.idempotency_key,
                request.payload,
                self._clock.now_ms(),
            )
        if known == "committed":
            # The caller may have lost the first answer (a crash after the effect): give it the
            # recipient's stored result again, or it could not bind a compensator to it.
            body = await self._stored_result(request)
            return EffectResult(
                effect_id, known, 200 if body else None, body, reconciled=False, replayed=True
            )
        if known == "failed":
            return EffectResult(effect_id, known, None, None, reconciled=False, replayed=True)
        try:
            # Tool protection before step 2: a refusal here records nothing and sends nothing.
            async with self._protection.guard(request.tool) as guard:
                if known is None:
                    await self._record_intent(request, effect_id)  # step 2
                else:
                    reconciled = await self._reconcile(request, effect_id, guard)  # step 3
                    if reconciled is not None:
                        return reconciled
                return await self._dispatch(request, effect_id, guard)
        except CircuitOpen as exc:
            raise circuit_open_problem(exc, pending_intent=known is not None) from None
        except BulkheadFull as exc:
            raise bulkhead_full_problem(exc, pending_intent=known is not None) from None

    def _refuse_tombstoned(self, request: EffectRequest) -> None:
        names = effect_action_hashes(request.tool, request.operation, request.payload, request.action_hash)
        hit = tombstoned_action(self.tombstones(request.run_id), names)
        if hit is None:
            return
        log.warning(
            "effect refused: action %s is tombstoned",
            hit,
            extra={"fields": {"runId": request.run_id, "reason": "action-tombstoned"}},
        )
        raise EffectRefused(
            "action-tombstoned",
            f"{request.tool} {request.operation} with this payload (action {hit}) was tombstoned for run "
            f"{request.run_id} by the semantic watchdog (WD-5 level 2); nothing was recorded or sent",
            code="ACTION_TOMBSTONED",
            runId=request.run_id,
            actionHash=hit,
        )

    async def _stored_result(
        self, request: EffectRequest, guard: Guarded | None = None
    ) -> dict[str, Any] | None:
        """The recipient's stored result under the key; `guard`: a call of an admitted effect
        (timed and reported to the breaker), None: a replay's lookup outside protection."""
        try:
            if guard is None:
                probe = await self._tools.probe(request.tool, request.idempotency_key)
            else:
                probe = await guard.call(
                    lambda: self._tools.probe(request.tool, request.idempotency_key), probe=True
                )
        except ToolUnreachable:
            return None
        return probe.body if probe.status == 200 else None

    async def verify(
        self, tool: str, verifier: str, run_id: str, payload: dict[str, Any], caller: Principal | None = None
    ) -> ToolAnswer:
        """A tool's deterministic verifier, for the saga's pre-pivot gate (SAGA-6)."""
        if not self._tools.knows(tool):
            raise EffectRefused("unknown-tool", f"no tool {tool!r}; known: {self._tools.names()}")
        if caller is not None and not caller.is_service:
            view = self.view(run_id)
            if view is None:
                raise EffectRefused("run-not-found", f"run {run_id} does not exist", runId=run_id)
            refusal = authorize_verify(caller, view)
            if refusal is not None:
                raise _refused(refusal, runId=run_id)
        try:
            async with self._protection.guard(tool) as guard:
                return await guard.call(lambda: self._tools.verify(tool, verifier, run_id, payload))
        except CircuitOpen as exc:
            raise circuit_open_problem(exc) from None
        except BulkheadFull as exc:
            raise bulkhead_full_problem(exc) from None
        except ToolUnreachable as exc:
            raise EffectRefused("outcome-unknown", str(exc)) from exc

    async def _record_intent(self, request: EffectRequest, effect_id: str) -> None:
        command = RecordEffectIntent(
            command_id=derived_id("cmd", effect_id, "intent"),
            run_id=request.run_id,
            issued_at=self._clock.now_ms(),
            correlation_id=request.attempt_id,
            actor=ACTOR,
            attempt_id=request.attempt_id,
            lease_epoch=request.epoch,
            effect_id=effect_id,
            idempotency_key=request.idempotency_key,
            tool=request.tool,
            operation=request.operation,
        )
        try:
            decision = await self._send(command)
        except Exception as exc:  # NotDurable: Kafka did not take the intent in time; nothing was sent
            raise EffectRefused(
                "unavailable", f"the intent was not recorded ({exc}); nothing was sent"
            ) from exc
        if isinstance(decision, Rejected):
            code = decision.rejection.code
            if code == "DUPLICATE_EFFECT":
                return  # recorded by a concurrent request: dispatching with the same key is safe
            slug = code.lower().replace("_", "-")
            raise EffectRefused(
                slug if slug in COORDINATOR_REFUSALS else "intent-refused",
                decision.rejection.detail,
                code=code,
                runId=request.run_id,
            )
        if decision is None:
            # Without a durable intent nothing may be sent (intent before action).
            raise EffectRefused("unavailable", "the intent was not confirmed in time; nothing was sent")

    async def _reconcile(self, request: EffectRequest, effect_id: str, guard: Guarded) -> EffectResult | None:
        try:
            probe = await guard.call(
                lambda: self._tools.probe(request.tool, request.idempotency_key), probe=True
            )
        except ToolUnreachable as exc:
            raise EffectRefused("outcome-unknown", f"cannot reconcile: {exc}") from exc
        if probe.status == 200:
            await self._record_outcome(request, effect_id, "committed", "found by probe")
            return EffectResult(effect_id, "committed", probe.status, probe.body, reconciled=True)
        return None

    async def _dispatch(self, request: EffectRequest, effect_id: str, guard: Guarded) -> EffectResult:
        answer: ToolAnswer | None = None

        def send() -> Awaitable[ToolAnswer]:
            return self._tools.dispatch(
                request.tool,
                request.run_id,
                request.epoch,
                request.idempotency_key,
                request.operation,
                request.payload,
            )

        for attempt in (1, 2):
            try:
                answer = await guard.call(send)
                break
            except ToolUnreachable as exc:
                if guard.blocked:
                    # The canary failed, or the breaker opened: no probe of a failing endpoint
                    # now. The intent is recorded; the next try under this key reconciles first.
                    await self._record_outcome(request, effect_id, "unknown", f"{exc}; breaker open")
                    raise EffectRefused(
                        "outcome-unknown",
                        f"{exc}; the circuit breaker of {guard.endpoint} is open, so the effect was "
                        "not probed: retry with the same idempotency key once it closes",
                    ) from exc
                log.warning("dispatch of %s failed (%s); probing before any retry", effect_id, exc)
                try:
                    probe: ToolAnswer | None = await guard.call(
                        lambda: self._tools.probe(request.tool, request.idempotency_key), probe=True
                    )
                except ToolUnreachable:
                    probe = None
                if probe is not None and probe.status == 200:  # step 5: it happened after all
                    await self._record_outcome(request, effect_id, "committed", "found by probe")
                    return EffectResult(effect_id, "committed", probe.status, probe.body, reconciled=True)
                if probe is not None and probe.status == 404 and exc.answer is not None:
                    # The tool answered with its own error and the probe shows nothing happened:
                    # a definite failure with the tool's problem, not an ambiguity.
                    answer = exc.answer
                    break
                if attempt == 2:
                    await self._record_outcome(request, effect_id, "unknown", str(exc))
                    raise EffectRefused("outcome-unknown", f"{exc}; the probe found nothing") from exc
        assert answer is not None
        if 200 <= answer.status < 300:
            await self._record_outcome(request, effect_id, "committed", "")
            if "raw" in answer.body:
                # The effect happened but its answer is garbled: the recipient's stored result,
                # fetched by the same idempotency key, is the answer (REC-6 applied to corruption).
                stored = None if guard.blocked else await self._stored_result(request, guard)
                if stored is not None:
                    return EffectResult(effect_id, "committed", answer.status, stored, reconciled=True)
            return EffectResult(effect_id, "committed", answer.status, answer.body, reconciled=False)
        if answer.status == 409 and (answer.problem_type or "").endswith("stale-epoch"):
            await self._record_outcome(request, effect_id, "failed", "fenced by the recipient")
            raise EffectRefused(
                "fenced-by-recipient",
                f"{request.tool} refused epoch {request.epoch}: a newer holder exists",
                toolResponse=answer.body,
            )
        await self._record_outcome(request, effect_id, "failed", f"tool answered {answer.status}")
        raise EffectRefused(
            "tool-failed",
            f"{request.tool} refused the effect with {answer.status}",
            toolStatus=answer.status,
            toolResponse=answer.body,
        )

    async def _record_outcome(
        self, request: EffectRequest, effect_id: str, outcome: str, detail: str
    ) -> None:
        command = RecordEffectOutcome(
            command_id=derived_id("cmd", effect_id, "outcome", outcome),
            run_id=request.run_id,
            issued_at=self._clock.now_ms(),
            correlation_id=request.attempt_id,
            actor=ACTOR,
            attempt_id=request.attempt_id,
            lease_epoch=request.epoch,
            effect_id=effect_id,
            outcome=outcome,
            detail=self._quarantine.in_flight_note(request.run_id, detail),
        )
        # Durable, not decided: the answer waits for Kafka's acknowledgement of the command, not
        # for the coordinator's transaction. The intent was decided before the effect (that is
        # the fencing check); the outcome only tells later repeats what happened, and it is on
        # the log, ahead of anything the caller sends after this answer. A repeat that comes
        # before the coordinator has decided it reconciles by probing, as after a crash. This
        # took one serial transaction (~13 ms) off every effect.
        try:
            produced = self._publisher.publish(command_record(self._codec, command))
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(produced)), self._timeout)
        except Exception as exc:  # BufferError, TimeoutError, a Kafka error
            # The intent is durable: whoever asks again under the key reconciles by probing.
            log.warning("outcome %s of %s not recorded: %s", outcome, effect_id, exc)

    async def _send(self, command: RecordEffectIntent) -> Any:
        record = command_record(self._codec, command)
        return await publish_and_await(
            self._publisher, self._decisions, record, command.command_id, self._timeout
        )

    async def close(self) -> None:
        self._feed.close()
        self._board.close()
        self._quarantine.fold.close()
        self._breaker_decisions.close()
        self._decisions.close()
        self._publisher.close()
        await self._tools.close()
