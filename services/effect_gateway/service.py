"""The gateway's moving parts: the follower of runs.events and the effect protocol.

Protocol for one effect (numbered, because a crash can cut it anywhere):
  1. Refuse at once if the run's epoch, as folded from the log, is above the caller's.
  2. Record the intent through the coordinator (RecordEffectIntent): the coordinator checks the
     attempt and epoch against the lease it owns, so a holder replaced by a takeover is refused
     even if this gateway has not yet seen the takeover. Nothing is sent before this is durable.
  3. If an intent for this idempotency key already existed, reconcile first: probe the tool.
  4. Dispatch with the idempotency key and the epoch; the tool checks the epoch too.
  5. On a timeout or a 5xx, probe with the same key before any re-dispatch (REC-6): found means
     committed; absent after a 5xx answer means that answer was a definite failure; absent after
     no answer means one more dispatch with the same key; still nothing means "unknown".
  6. Record the outcome (committed / failed / unknown) through the coordinator.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

from services.common.clock import SystemClock
from services.common.contracts import EVENT_TYPES, RecordEffectIntent, RecordEffectOutcome
from services.common.decisions import Decided, DecisionListener, Rejected, publish_and_await
from services.common.ids import derived_id
from services.common.kafka import CommandPublisher, TopicFollower
from services.common.messages import MessageCodec, UndecodableRecord
from services.common.routing import command_record
from services.common.topics import RUNS_EVENTS
from services.effect_gateway.fencing import FencingView, fold_fencing
from services.effect_gateway.tools import ToolAnswer, ToolRegistry, ToolUnreachable

__all__ = ["EffectRefused", "EffectRequest", "EffectResult", "Gateway", "effect_id_for"]

log = logging.getLogger("tenure.effect_gateway")
ACTOR = "tenure-effect-gateway"


def effect_id_for(run_id: str, idempotency_key: str) -> str:
    return derived_id("eff", run_id, idempotency_key)


@dataclass(frozen=True)
class EffectRequest:
    run_id: str
    attempt_id: str
    epoch: int
    idempotency_key: str
    tool: str
    operation: str
    payload: dict[str, Any]


@dataclass(frozen=True)
class EffectResult:
    effect_id: str
    outcome: str
    tool_status: int | None
    tool_response: dict[str, Any] | None
    reconciled: bool
    replayed: bool = False


class EffectRefused(Exception):
    def __init__(self, slug: str, detail: str, status: int | None = None, **extensions: Any) -> None:
        super().__init__(detail)
        self.slug = slug
        self.detail = detail
        self.status = status
        self.extensions = extensions


class Gateway:
    def __init__(self, bootstrap_servers: str, tools: ToolRegistry, decision_timeout_s: float = 5.0) -> None:
        self._codec = MessageCodec()
        self._clock = SystemClock()
        self._tools = tools
        self._timeout = decision_timeout_s
        self._views: dict[str, FencingView] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._caught_up = threading.Event()
        self._follower = TopicFollower(bootstrap_servers, [RUNS_EVENTS.name], "beginning", "tenure-gateway")
        self._targets = {p: end for p, end in self._follower.end_offsets(RUNS_EVENTS.name).items() if end > 0}
        self._publisher = CommandPublisher(bootstrap_servers, client_id="tenure-effect-gateway")
        self._decisions = DecisionListener(bootstrap_servers, self._codec)
        self._thread = threading.Thread(target=self._follow, name="gateway-follower", daemon=True)
        self._thread.start()

    # --- following the log --------------------------------------------------------------------

    def _follow(self) -> None:
        while not self._stop.is_set():
            for record in self._follower.poll(max_records=2000, timeout_s=0.1):
                try:
                    event = self._codec.decode(record.value)
                except UndecodableRecord:
                    continue
                if isinstance(event, EVENT_TYPES):
                    with self._lock:
                        self._views[event.run_id] = fold_fencing(self._views.get(event.run_id), event)
            if not self._caught_up.is_set():
                positions = self._follower.positions(RUNS_EVENTS.name)
                if all(positions.get(p, -1) >= end for p, end in self._targets.items()):
                    self._caught_up.set()
        self._follower.close()

    @property
    def ready(self) -> bool:
        return self._caught_up.is_set()

    def view(self, run_id: str) -> FencingView | None:
        with self._lock:
            return self._views.get(run_id)

    # --- the protocol -------------------------------------------------------------------------

    async def perform(self, request: EffectRequest) -> EffectResult:
        if not self.ready:
            raise EffectRefused("unavailable", "the gateway is still reading the lease log", status=503)
        if not self._tools.knows(request.tool):
            raise EffectRefused("unknown-tool", f"no tool {request.tool!r}; known: {self._tools.names()}")
        view = self.view(request.run_id)
        if view is None:
            raise EffectRefused("run-not-found", f"run {request.run_id} does not exist")
        if request.epoch < view.epoch:  # step 1
            raise EffectRefused(
                "stale-epoch",
                f"epoch {request.epoch} is stale: run {request.run_id} is at epoch {view.epoch}",
                currentEpoch=view.epoch,
            )
        effect_id = effect_id_for(request.run_id, request.idempotency_key)
        known = view.effects.get(effect_id)
        if known == "committed":
            # The caller may have lost the first answer (a crash after the effect): give it the
            # recipient's stored result again, or it could not bind a compensator to it.
            body = await self._stored_result(request)
            return EffectResult(
                effect_id, known, 200 if body else None, body, reconciled=False, replayed=True
            )
        if known == "failed":
            return EffectResult(effect_id, known, None, None, reconciled=False, replayed=True)
        if known is None:
            await self._record_intent(request, effect_id)  # step 2
        else:
            reconciled = await self._reconcile(request, effect_id)  # step 3
            if reconciled is not None:
                return reconciled
        return await self._dispatch(request, effect_id)

    async def _stored_result(self, request: EffectRequest) -> dict[str, Any] | None:
        try:
            probe = await self._tools.probe(request.tool, request.idempotency_key)
        except ToolUnreachable:
            return None
        return probe.body if probe.status == 200 else None

    async def verify(self, tool: str, verifier: str, run_id: str, payload: dict[str, Any]) -> ToolAnswer:
        """A tool's deterministic verifier, for the saga's pre-pivot gate (SAGA-6)."""
        if not self._tools.knows(tool):
            raise EffectRefused("unknown-tool", f"no tool {tool!r}; known: {self._tools.names()}")
        try:
            return await self._tools.verify(tool, verifier, run_id, payload)
        except ToolUnreachable as exc:
            raise EffectRefused("outcome-unknown", str(exc), status=504) from exc

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
        decision = await self._send(command)
        if isinstance(decision, Rejected):
            code = decision.rejection.code
            if code == "DUPLICATE_EFFECT":
                return  # recorded by a concurrent request: dispatching with the same key is safe
            slug = code.lower().replace("_", "-")
            raise EffectRefused(slug, decision.rejection.detail, status=409, code=code)
        if decision is None:
            # Without a durable intent nothing may be sent (intent before action).
            raise EffectRefused(
                "unavailable", "the intent was not confirmed in time; nothing was sent", status=503
            )

    async def _reconcile(self, request: EffectRequest, effect_id: str) -> EffectResult | None:
        try:
            probe = await self._tools.probe(request.tool, request.idempotency_key)
        except ToolUnreachable as exc:
            raise EffectRefused("outcome-unknown", f"cannot reconcile: {exc}", status=504) from exc
        if probe.status == 200:
            await self._record_outcome(request, effect_id, "committed", "found by probe")
            return EffectResult(effect_id, "committed", probe.status, probe.body, reconciled=True)
        return None

    async def _dispatch(self, request: EffectRequest, effect_id: str) -> EffectResult:
        answer: ToolAnswer | None = None
        for attempt in (1, 2):
            try:
                answer = await self._tools.dispatch(
                    request.tool,
                    request.run_id,
                    request.epoch,
                    request.idempotency_key,
                    request.operation,
                    request.payload,
                )
                break
            except ToolUnreachable as exc:
                log.warning("dispatch of %s failed (%s); probing before any retry", effect_id, exc)
                try:
                    probe: ToolAnswer | None = await self._tools.probe(request.tool, request.idempotency_key)
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
                    raise EffectRefused(
                        "outcome-unknown", f"{exc}; the probe found nothing", status=504
                    ) from exc
        assert answer is not None
        if 200 <= answer.status < 300:
            await self._record_outcome(request, effect_id, "committed", "")
            if "raw" in answer.body:
                # The effect happened but its answer is garbled: the recipient's stored result,
                # fetched by the same idempotency key, is the answer (REC-6 applied to corruption).
                stored = await self._stored_result(request)
                if stored is not None:
                    return EffectResult(effect_id, "committed", answer.status, stored, reconciled=True)
            return EffectResult(effect_id, "committed", answer.status, answer.body, reconciled=False)
        if answer.status == 409 and (answer.problem_type or "").endswith("stale-epoch"):
            await self._record_outcome(request, effect_id, "failed", "fenced by the recipient")
            raise EffectRefused(
                "fenced-by-recipient",
                f"{request.tool} refused epoch {request.epoch}: a newer holder exists",
                status=409,
                toolResponse=answer.body,
            )
        await self._record_outcome(request, effect_id, "failed", f"tool answered {answer.status}")
        raise EffectRefused(
            "tool-failed",
            f"{request.tool} refused the effect with {answer.status}",
            status=502,
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
            detail=detail,
        )
        decision = await self._send(command)
        if not isinstance(decision, Decided):
            log.warning("outcome %s of %s not confirmed: %s", outcome, effect_id, decision)

    async def _send(self, command: RecordEffectIntent | RecordEffectOutcome) -> Any:
        record = command_record(self._codec, command)
        return await publish_and_await(
            self._publisher, self._decisions, record, command.command_id, self._timeout
        )

    async def close(self) -> None:
        self._stop.set()
        self._decisions.close()
        self._publisher.close()
        await self._tools.close()
