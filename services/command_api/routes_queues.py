"""Claim-next: POST /queues/{queue}/claim hands a runner the next queued run it can run (issue 17).

Runners stop listing runs and racing each other for them: the API picks.

* **A run's queue** is its executionSpec's `queue` (a string), else its `queue` label, else
  `default`. **Its required capabilities** are executionSpec `requiredCapabilities` (a list of
  strings): a runner is offered only runs whose every required capability it declares.
* **Fairness across tenants**: the candidates are the queue's queued runs (oldest submission
  first within a tenant), taken round-robin over the tenants that have one, starting with the
  tenant after the one this API instance served last on this queue. A tenant with a thousand
  queued runs therefore cannot starve one with a single run: each claim goes to the next tenant
  in turn. The rotation is remembered per API instance (with several instances behind a load
  balancer it is per instance, which is still fair in the long run).
* **Races**: each candidate is claimed through the lease coordinator with the ordinary ClaimRun
  command. The coordinator is the only judge: when it refuses (another runner claimed the run a
  moment earlier, its deadline passed, its attempts are used up), the next candidate is tried.
  Two claims of the same run inside this instance are not even sent: a run being claimed by one
  request is skipped by the others.
* **Answers**: 201 with the grant (the same body as POST /runs/{runId}/attempts, plus `queue`,
  `tenant` and `waitedMs`: how long the request waited before the claim that was granted was
  sent, so a runner counts its lease from its own send time plus that, never past the grant),
  204 when nothing is claimable, 202 when the coordinator did not decide in time (the claim may
  still be granted: the lease then expires unrenewed, LEASE-5). `waitSeconds` long-polls: the
  request waits up to that long (bounded by the request's deadline, TENURE_DECISION_TIMEOUT_S)
  for a claimable run to appear before answering 204.
* **Idempotency**: with an `Idempotency-Key`, each claim's command id is derived from the run,
  the key and the caller, so a repeat (a runner whose 201 was lost) answers the same grant, 201,
  on ANY instance, instead of claiming a second run and leaving the first lease to expire
  (issue 16). The instance that made the grant remembers which run the key claimed (the last
  REMEMBERED_KEYS keys): its fast path. Any other instance finds the grant in the log: it first
  folds runs.events up to where it ends now (the read barrier of every view read, so a grant
  another instance saw decided is folded), then, among the runs whose lease the caller holds
  now (the views' held/ index: a few runs, never the store), the one whose claim's command id
  is the one this key derives for that run (the causation id of its AttemptClaimed). Only then
  does it claim anew; a barrier that cannot be met is a 503, never a second claim. The key is
  the caller's: another principal's same key derives other command ids, so it never answers
  this caller's grant. The repeat carries every field of the first answer. Its `waitedMs` is
  the FIRST request's wait where that is remembered (the repeat itself waited for nothing, and
  its claim was sent by that first request): added to the time of the first send under the key,
  as the runner SDK counts, it is still when the granted claim was sent, so never past the grant
  (LEASE-4, LEASE-5). Another instance does not know that wait and answers 0: first send + 0 is
  still before the claim was sent, so the runner can only believe its lease ends earlier than it
  does, never later (safe; it may renew early). A caller that counts from the repeat's own send
  time overestimates its lease whatever the value (the grant was made before the repeat was
  sent), so it must count from its first send. A lease no longer held (it expired before the
  repeat) is only found by the instance that remembers the key (it answers the old grant, whose
  renewals are refused, LEASE-5); elsewhere the repeat claims anew.
* **Scan bound**: at most MAX_SCANNED queued runs (oldest first) are considered per look.
"""

from __future__ import annotations

import asyncio
import re
from collections import OrderedDict
from typing import Any

from fastapi import APIRouter, Header, Path, Request
from fastapi.responses import JSONResponse, Response
from pydantic import Field

from services.command_api.context import ApiContext, pending_response
from services.command_api.models import ClaimRequest, PendingCommand
from services.command_api.problems import ApiProblem
from services.command_api.routes_leases import _grant, _replayed_grant
from services.common.auth import Role, require_role
from services.common.contracts import AttemptClaimed, ClaimRun
from services.common.decisions import Rejected
from services.common.ids import command_id_for

__all__ = [
    "DEFAULT_QUEUE",
    "MAX_SCANNED",
    "MAX_WAIT_SECONDS",
    "REMEMBERED_KEYS",
    "QueueClaimRequest",
    "TenantRotation",
    "fair_order",
    "queue_of",
    "queues_router",
    "required_capabilities",
]

DEFAULT_QUEUE = "default"
MAX_SCANNED = 1000
MAX_WAIT_SECONDS = 60
REMEMBERED_KEYS = 10_000
QUEUE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,99}$"
_QUEUE = re.compile(QUEUE_PATTERN)
_PAGE = 200
_POLL_S = 0.2
# What the answer needs after the last look: the claim itself, and a moment to write it.
_CLAIM_MARGIN_S = 1.0


def _keyed_cause(who: str, key: str) -> str:
    """What a keyed claim's command id is derived from (with the run): the caller and its key."""
    return f"queue:{who}:{key}"


class QueueClaimRequest(ClaimRequest):
    waitSeconds: int = Field(
        default=0,
        ge=0,
        le=MAX_WAIT_SECONDS,
        description="Long-poll: wait up to this long (bounded by the request's deadline) for a "
        "claimable run before answering 204.",
    )


def queue_of(view: dict[str, Any]) -> str:
    """The queue a run waits in: executionSpec.queue, else its `queue` label, else `default`."""
    spec = view.get("executionSpec")
    if isinstance(spec, dict) and isinstance(spec.get("queue"), str) and spec["queue"]:
        return str(spec["queue"])
    labels = view.get("labels")
    if isinstance(labels, dict) and isinstance(labels.get("queue"), str) and labels["queue"]:
        return str(labels["queue"])
    return DEFAULT_QUEUE


def required_capabilities(view: dict[str, Any]) -> frozenset[str]:
    spec = view.get("executionSpec")
    wanted = spec.get("requiredCapabilities") if isinstance(spec, dict) else None
    if not isinstance(wanted, list):
        return frozenset()
    return frozenset(str(c) for c in wanted)


class TenantRotation:
    """Per queue, the tenant served last (this instance's memory of whose turn it is)."""

    def __init__(self) -> None:
        self._last: dict[str, str] = {}

    def last(self, queue: str) -> str | None:
        return self._last.get(queue)

    def served(self, queue: str, tenant: str) -> None:
        self._last[queue] = tenant


def fair_order(candidates: list[dict[str, Any]], last_tenant: str | None) -> list[dict[str, Any]]:
    """Round-robin over tenants (sorted by name, starting after `last_tenant`), oldest first
    within each tenant: the order in which candidates are offered to the coordinator."""
    by_tenant: dict[str, list[dict[str, Any]]] = {}
    for view in sorted(candidates, key=lambda v: (int(v["submittedAt"]), v["runId"])):
        by_tenant.setdefault(str(view["tenant"]), []).append(view)
    tenants = sorted(by_tenant)
    if last_tenant is not None:
        after = [t for t in tenants if t > last_tenant]
        tenants = after + [t for t in tenants if t <= last_tenant]
    ordered: list[dict[str, Any]] = []
    depth = max((len(runs) for runs in by_tenant.values()), default=0)
    for i in range(depth):
        ordered.extend(by_tenant[t][i] for t in tenants if i < len(by_tenant[t]))
    return ordered


def queues_router(ctx: ApiContext) -> APIRouter:
    router = ctx.guarded()
    rotation = TenantRotation()
    claiming: set[str] = set()  # runs a request of this instance is claiming right now
    # (caller, Idempotency-Key) -> (run id, claim command id, the first request's waitedMs),
    # least recently used first
    keyed: OrderedDict[tuple[str, str], tuple[str, str, int]] = OrderedDict()

    def remember(who: str, key: str, run_id: str, command_id: str, waited_ms: int) -> None:
        keyed[(who, key)] = (run_id, command_id, waited_ms)
        keyed.move_to_end((who, key))
        while len(keyed) > REMEMBERED_KEYS:
            keyed.popitem(last=False)

    async def replayed(who: str, key: str) -> Any:
        """The grant an earlier claim-next under this key made, if this instance remembers it."""
        found = keyed.get((who, key))
        if found is None:
            return None
        return await answered(*found)

    async def granted_on_log(who: str, key: str) -> Any:
        """The grant a claim-next under this key made on any instance, found in the log (after
        the read barrier) among the runs whose lease `who` holds now; None: there is none."""
        held = await ctx.in_thread("the run views", ctx.deps.views.held_by, who)
        for run_id, claimed_by in held.items():
            command_id = command_id_for(run_id, "ClaimRun", _keyed_cause(who, key))
            if claimed_by != command_id:
                continue
            # 0: the first request's wait is not known here; see the module doc (Idempotency).
            remember(who, key, run_id, command_id, 0)
            return await answered(run_id, command_id, 0)
        return None

    async def answered(run_id: str, command_id: str, waited_ms: int) -> Any:
        view = await ctx.view(run_id)
        entry = next((e for e in (view or {}).get("history", []) if e.get("causationId") == command_id), None)
        if view is None or entry is None:
            return None
        grant = {
            **_replayed_grant(dict(entry), view),
            "queue": queue_of(view),
            "tenant": view["tenant"],
            "waitedMs": waited_ms,  # the first request's, or 0: see the module doc (Idempotency)
        }
        return JSONResponse(grant, status_code=201, headers={"Location": f"/runs/{run_id}"})

    async def candidates(queue: str, capabilities: frozenset[str]) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        cursor: str | None = None
        scanned = 0
        while scanned < MAX_SCANNED:
            page = await ctx.in_thread("the run views", ctx.deps.views.list, "queued", _PAGE, cursor)
            scanned += len(page.items)
            found.extend(
                view
                for view in page.items
                if view.get("status") == "queued"
                and queue_of(view) == queue
                and required_capabilities(view) <= capabilities
                and view["runId"] not in claiming
            )
            cursor = page.next_cursor
            if cursor is None:
                break
        return found

    async def try_claim(
        view: dict[str, Any],
        body: QueueClaimRequest,
        request: Request,
        who: str,
        key: str | None,
        waited_ms: int,
    ) -> Any:
        run_id = view["runId"]
        # Derived, so that the same request sent again is the same command (the coordinator
        # answers a repeated command id with its first decision).
        cause = _keyed_cause(who, key) if key else f"queue:{body.runnerId}:{view['version']}"
        command_id = command_id_for(run_id, "ClaimRun", cause)
        if key:
            remember(who, key, run_id, command_id, waited_ms)
        command = ClaimRun(
            command_id=command_id,
            run_id=run_id,
            issued_at=ctx.deps.clock.now_ms(),
            correlation_id=request.headers.get("x-correlation-id") or run_id,
            actor=who,
            runner_id=body.runnerId,
            holder_kind=body.holderKind,
            capabilities=tuple(body.capabilities),
            lease_seconds=body.leaseSeconds or 0,
            heartbeat_seconds=body.heartbeatSeconds or 0,
        )
        claiming.add(run_id)
        try:
            return await ctx.publish_and_wait(command, wait_for_view=False)
        finally:
            claiming.discard(run_id)

    @router.post(
        "/queues/{queue}/claim",
        status_code=201,
        summary="Claim the next queued run of a queue this runner can run (tenant-fair)",
        responses={204: {"description": "Nothing is claimable (after waitSeconds)."}},
    )
    async def claim_next(
        body: QueueClaimRequest,
        request: Request,
        queue: str = Path(description="executionSpec.queue, else the run's queue label, else 'default'."),
        idempotency_key: str | None = Header(default=None, alias="Idempotency-Key", max_length=200),
    ) -> Any:
        """A repeat under the same Idempotency-Key answers the grant it made, on any instance, with
        the same fields; its `waitedMs` is the first request's wait, or 0 on an instance that does
        not remember it (the module doc says why)."""
        who = ctx.principal(request)
        # The roles that may claim a run by id (POST /runs/{runId}/attempts) may claim the next one.
        require_role(who, "claiming a run", Role.SUBMITTER, Role.RUNNER, Role.OPERATOR)
        if not _QUEUE.fullmatch(queue):
            raise ApiProblem(
                "validation-failed", f"queue {queue[:80]!r} must match {QUEUE_PATTERN}", queue=queue[:80]
            )
        if idempotency_key:
            # This instance's memory first; else the log, caught up with every instance's writes.
            earlier = await replayed(who.name, idempotency_key)
            if earlier is None:
                earlier = await granted_on_log(who.name, idempotency_key)
            if earlier is not None:
                return earlier
        capabilities = frozenset(body.capabilities)
        loop = asyncio.get_running_loop()
        started = loop.time()
        wait_until = loop.time() + min(float(body.waitSeconds), max(0.0, ctx.remaining() - _CLAIM_MARGIN_S))
        while True:
            found = await candidates(queue, capabilities)
            for view in fair_order(found, rotation.last(queue)):
                if ctx.remaining() <= _CLAIM_MARGIN_S / 2:
                    break
                # How long this request waited before it sent the claim that may be granted: the
                # runner may count its lease from its send time plus this (never past the grant).
                waited_ms = int((loop.time() - started) * 1000)
                outcome = await try_claim(view, body, request, who.name, idempotency_key, waited_ms)
                if isinstance(outcome, Rejected):
                    if idempotency_key:
                        keyed.pop((who.name, idempotency_key), None)
                    continue  # claimed by another runner a moment ago, past its deadline, ...: next
                if isinstance(outcome, PendingCommand):
                    return pending_response(outcome)
                event = outcome.decided.event
                assert isinstance(event, AttemptClaimed)
                rotation.served(queue, str(view["tenant"]))
                grant = {
                    **_grant(event, view),
                    "queue": queue,
                    "tenant": view["tenant"],
                    "waitedMs": waited_ms,
                }
                return JSONResponse(grant, status_code=201, headers={"Location": f"/runs/{event.run_id}"})
            if loop.time() + _POLL_S > wait_until:
                return Response(status_code=204)
            await asyncio.sleep(_POLL_S)

    return router
