"""The gateway's side of a quarantine (QUA-1): refuse a quarantined run, and trigger on egress.

* Every effect of a quarantined run is refused with RUN_QUARANTINED (problem `run-quarantined`),
  whatever the epoch: the state is folded from quarantine.events (services.quarantine.view), as
  the breakers are from breakers.events, so the check is a dictionary lookup.
* An effect aimed at a host outside the egress allowlist (services/effect_gateway/egress.py) is
  refused before anything is recorded or dispatched (`egress-not-allowed`), and the same decision
  starts the run's quarantine: a StartQuarantine (trigger egress-policy) is published, durable
  before the refusal is answered, under a command id derived from the run and the effect's
  idempotency key (a retried effect is the same trigger).
* An effect whose outcome is recorded after its run was quarantined was in flight at the
  quarantine: its outcome's detail says so (`in_flight_note`).
The per-run facts it needs (the tenant, the allowlist of the executionSpec) are folded from the
RunSubmitted events the gateway's follower reads anyway.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

from services.common.contracts import RunSubmitted
from services.common.contracts.quarantine import IN_FLIGHT_NOTE, StartQuarantine
from services.common.ids import canonical_json, derived_id
from services.common.kafka import CommandPublisher
from services.common.logs import log_fields
from services.common.messages import MessageCodec
from services.effect_gateway.egress import check_egress, run_allowlist
from services.effect_gateway.fencing import FencingView
from services.effect_gateway.refusals import EffectRefused
from services.quarantine.routing import quarantine_command_record
from services.quarantine.view import QuarantineFold

__all__ = ["ACTOR", "IN_FLIGHT_NOTE", "QuarantineGuard", "egress_trigger_id"]

log = logging.getLogger("tenure.effect_gateway.quarantine")
ACTOR = "tenure-effect-gateway"


def egress_trigger_id(run_id: str, idempotency_key: str) -> str:
    return derived_id("cmd", run_id, "egress-quarantine", idempotency_key)


class QuarantineGuard:
    def __init__(
        self,
        fold: QuarantineFold,
        publisher: CommandPublisher,
        codec: MessageCodec,
        tool_egress: dict[str, tuple[str, ...]],
        *,
        publish_timeout_s: float = 5.0,
    ) -> None:
        self.fold = fold
        self._publisher = publisher
        self._codec = codec
        self._tool_egress = tool_egress
        self._timeout = publish_timeout_s
        self._lock = threading.Lock()
        self._tenants: dict[str, str] = {}
        self._allowlists: dict[str, tuple[str, ...]] = {}

    def fold_run(self, event: object) -> None:
        """Keep the per-run facts of a RunSubmitted (from the gateway's follower thread)."""
        if not isinstance(event, RunSubmitted):
            return
        hosts = run_allowlist(event.execution_spec)
        with self._lock:
            self._tenants[event.run_id] = event.tenant
            if hosts is not None:
                self._allowlists[event.run_id] = hosts

    def refuse_quarantined(self, run_id: str) -> None:
        state = self.fold.quarantine(run_id)
        if state is None or state.status.value != "quarantined":
            return
        raise EffectRefused(
            "run-quarantined",
            f"run {run_id} is quarantined ({state.trigger}: {state.reason}); every effect of it is "
            "refused, whatever the epoch; nothing was recorded or sent",
            code="RUN_QUARANTINED",
            runId=run_id,
            trigger=state.trigger,
        )

    def in_flight_note(self, run_id: str, detail: str) -> str:
        if not self.fold.is_quarantined(run_id):
            return detail
        return f"{detail}; {IN_FLIGHT_NOTE}" if detail else IN_FLIGHT_NOTE

    async def check_egress(
        self, view: FencingView, tool: str, operation: str, key: str, payload: dict[str, Any], now_ms: int
    ) -> None:
        with self._lock:
            run_hosts = self._allowlists.get(view.run_id)
            tenant = self._tenants.get(view.run_id, "")
        violation = check_egress(payload, self._tool_egress.get(tool), run_hosts)
        if violation is None:
            return
        evidence = {
            "tool": tool,
            "operation": operation,
            "idempotencyKey": key,
            "host": violation.host,
            "allowlist": list(violation.allowlist),
            "declaredBy": violation.declared_by,
        }
        trigger = StartQuarantine(
            command_id=egress_trigger_id(view.run_id, key),
            run_id=view.run_id,
            issued_at=now_ms,
            correlation_id=view.run_id,
            actor=ACTOR,
            trigger="egress-policy",
            reason=f"egress to {violation.host or 'an unnamed host'} is not on the {violation.declared_by}'s "
            f"allowlist ({tool} {operation})",
            evidence=canonical_json(evidence),
            tenant=tenant or "unknown",
            holder=view.holder or "",
            lease_epoch=view.epoch,
            attempt_id=view.attempt_id or "",
            taint_from_step=-1,
            taint_from_at=0,
        )
        started = True
        try:
            produced = self._publisher.publish(quarantine_command_record(self._codec, trigger))
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(produced)), self._timeout)
        except Exception as exc:  # refused all the same; the trigger is retried with the effect
            started = False
            log.error(
                "egress violation of %s: quarantine trigger not published: %s",
                view.run_id,
                exc,
                extra=log_fields(run_id=view.run_id),
            )
        log.warning(
            "effect refused: egress to %s is not allowed; quarantine %s",
            violation.host,
            "started" if started else "NOT started",
            extra={"fields": {"runId": view.run_id, "reason": "egress-not-allowed"}},
        )
        raise EffectRefused(
            "egress-not-allowed",
            f"{tool} {operation} is aimed at {violation.host or 'an unnamed host'}, which is not on the "
            f"{violation.declared_by}'s egress allowlist; nothing was recorded or sent, and run "
            f"{view.run_id} is being quarantined",
            code="EGRESS_NOT_ALLOWED",
            runId=view.run_id,
            host=violation.host,
            allowlist=list(violation.allowlist),
            declaredBy=violation.declared_by,
            quarantineTriggered=started,
            quarantineCommandId=trigger.command_id,
        )
