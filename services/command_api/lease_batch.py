"""Batch renewal (issue 16): a runner host renews every lease it holds in one request.

`POST /leases:renew` takes up to MAX_BATCH_RENEWALS items {attemptId, leaseEpoch, sequence},
each exactly what one `POST /attempts/{id}/heartbeat` carries, and answers 200 with one result
per item, in the order given:

* `"status": "accepted"`: the coordinator renewed the lease; `expiresAt`, `serverTime`,
  `certainty`, `runStatus` and the stop flags (EXE-7/EXE-10), as the single heartbeat answers,
  plus `watchdog` (WD-5), the pending intervention of the run, or null;
* `"status": "replayed"`: the sequence was already used (a retried batch); nothing changed. The
  item has the same fields as an accepted one, from the run as it stands now (`expiresAt` and
  `certainty` of its lease, the stop flags, `watchdog`), so a retried batch still tells the
  runner of a stop requested since (EXE-7/EXE-10) or of an intervention (WD-5);
* `"status": "refused"`: `problem` is the problem+json body the single heartbeat would have
  answered with (`stale-epoch`, `unknown-attempt`, `not-lease-holder`, ...), status included;
* `"status": "pending"`: the command is durable but was not decided within the deadline
  (`commandId` to match later; sending the item again with the next sequence is safe);
* `"status": "unavailable"`: Kafka did not take this item's command (`problem` says why);
  the others were published. The answer also counts each status (`accepted`, `refused`, ...).

Why one request is cheaper than N: the caller is authenticated once, the holder check reads
every run's brief in one hop to a worker thread, the RenewLease commands travel in one
RenewLeases record per runs.commands partition (services.common.routing: one record to encode,
produce, store, fetch and decode instead of hundreds), and all decisions are awaited together
under the request's one deadline, with one wake-up when the last arrives. Each item is still
its own RenewLease command, with its own command id, fenced and decided exactly as a single
heartbeat is (LEASE-3, LEASE-5), so the coordinator's safety rules are unchanged. A record
Kafka did not take makes each of its items `unavailable`.

What is refused as a whole (nothing is published): a body over TENURE_MAX_BODY_BYTES (413, the
HTTP guard), more than MAX_BATCH_RENEWALS items, none, the same attemptId twice, or any item
out of bounds (422 `validation-failed`, problem+json, as for every body model); a broker that
acknowledged none of the commands (503 `unavailable`, Retry-After); and, by admission control,
any batch while one this API instance published earlier has waited longer than
TENURE_API_SHED_AFTER_MS for its decisions (503 `overloaded`, Retry-After: nothing is sent).
"""

from __future__ import annotations

import asyncio
import secrets
import uuid
from concurrent.futures import Future
from typing import Any

from fastapi import APIRouter, Request
from pydantic import Field, model_validator

from services.command_api.auth import Principal
from services.command_api.context import ApiContext
from services.command_api.models import ApiBody, Identifier, PositiveLong
from services.command_api.problems import CATALOG, REJECTION_PROBLEMS
from services.common.contracts import RenewLease
from services.common.contracts.ids import run_id_of_attempt
from services.common.decisions import Decided, Decision, Rejected
from services.common.routing import renewal_batch_records

__all__ = [
    "MAX_BATCH_RENEWALS",
    "BatchRenewalRequest",
    "RenewalItem",
    "add_batch_renewal",
    "replayed_fields",
    "stop_fields",
]

# 500 leases per request: a host of 100,000 runs at a 20 s heartbeat sends 10 requests/s, and
# the largest valid body (500 items of 200-character ids) stays far below the 1 MiB body limit.
MAX_BATCH_RENEWALS = 500
_ATTEMPT_OVERRIDES = {"RUN_NOT_FOUND": "unknown-attempt"}
_STATUSES = ("accepted", "replayed", "refused", "pending", "unavailable")


class RenewalItem(ApiBody):
    attemptId: Identifier = Field(min_length=1, max_length=200)
    leaseEpoch: PositiveLong = Field(description="The lease's fencing epoch (LEASE-3).")
    sequence: PositiveLong = Field(description="Strictly increasing per attempt; a repeat is idempotent.")


class BatchRenewalRequest(ApiBody):
    renewals: list[RenewalItem] = Field(min_length=1, max_length=MAX_BATCH_RENEWALS)

    @model_validator(mode="after")
    def _one_item_per_attempt(self) -> BatchRenewalRequest:
        seen: set[str] = set()
        for item in self.renewals:
            if item.attemptId in seen:
                raise ValueError(f"attempt {item.attemptId[:80]!r} appears twice; renew each lease once")
            seen.add(item.attemptId)
        return self


def stop_fields(run: dict[str, Any]) -> dict[str, Any]:
    """EXE-7/EXE-10: a requested stop, as every renewal answer carries it, from a run's brief or
    view (both have `status` and `stop`)."""
    stop = run.get("stop") or {}
    return {
        "stopRequested": run.get("status") == "cancelling",
        "stopKind": stop.get("kind"),
        "stopGraceUntil": stop.get("graceUntil"),
    }


def replayed_fields(view: dict[str, Any], attempt_id: str) -> dict[str, Any]:
    """What a repeated sequence answers besides its ids and serverTime: nothing was renewed, so
    the attempt's lease and the run as the view shows them now, with the stop flags from the
    same view (the attempt's lease, not another's: after a takeover it is in the history).

    A view not read (a batch's run this instance has not folded yet) answers as an accepted
    renewal without a brief does: the sequence was renewed, so a lease was held, running."""
    leases = (view.get("lease"), *view.get("leaseHistory", []))
    mine = (x for x in leases if x is not None and x.get("attemptId") == attempt_id)
    lease: dict[str, Any] = next(mine, {})
    return {
        "expiresAt": lease.get("expiresAt"),
        "certainty": lease.get("certainty"),
        "runStatus": view.get("status", "running"),
        **stop_fields(view),
    }


def _refused(item: RenewalItem, slug: str, detail: str, path: str, **extensions: Any) -> dict[str, Any]:
    return {
        "attemptId": item.attemptId,
        "status": "refused",
        "problem": CATALOG.body(slug, detail, path, **extensions),
    }


def _watchdog_briefs(ctx: ApiContext, run_ids: list[str]) -> dict[str, dict[str, Any] | None]:
    try:
        return ctx.deps.views.watchdog_briefs(run_ids)
    except Exception:  # delivery never fails the answer it rides on (watchdog_delivery.py)
        return dict.fromkeys(run_ids)


def add_batch_renewal(router: APIRouter, ctx: ApiContext) -> None:
    @router.post(
        "/leases:renew",
        summary="Renew many leases in one request (issue 16; EXE-4, LEASE-5)",
        description=__doc__,
        name="renew_leases",
    )
    async def renew_many(body: BatchRenewalRequest, request: Request) -> Any:
        who = ctx.principal(request)
        with ctx.admitted("renew_leases"):  # 503 overloaded while this API is far behind
            return await _renew_many(ctx, who, body.renewals, request.url.path)


async def _renew_many(ctx: ApiContext, who: Principal, items: list[RenewalItem], path: str) -> dict[str, Any]:
    """One admitted batch: the holder checks, every renewal published, the answers."""
    results: list[dict[str, Any] | None] = [None] * len(items)
    run_of: dict[int, str] = {}
    for index, item in enumerate(items):
        run_id = run_id_of_attempt(item.attemptId)
        if run_id is None:
            results[index] = _refused(
                item,
                "unknown-attempt",
                f"{item.attemptId[:80]!r} is not an attempt id this coordinator issued",
                path,
            )
        else:
            run_of[index] = run_id
    # One hop to a worker thread, and at most one wait for the fold, for all the briefs.
    briefs = await ctx.in_thread("the run views", ctx.deps.views.briefs, list(run_of.values()))
    # LEASE-1, as check_holder: knowing an attempt id is not enough to renew its lease.
    for index, run_id in list(run_of.items()):
        brief = briefs.get(run_id)
        holder = (brief or {}).get("holders", {}).get(items[index].attemptId)
        if holder and holder != who.name:
            lease_id = brief["leaseIds"][items[index].attemptId] if brief else "?"
            results[index] = _refused(
                items[index],
                "not-lease-holder",
                f"{who.name} does not hold lease {lease_id}",
                path,
                runId=run_id,
            )
            del run_of[index]
    issued_at = ctx.deps.clock.now_ms()  # one request, one issuedAt: its envelopes carry one
    commands = {
        index: RenewLease(
            # Each request its own command, as a heartbeat. 128 random bits like a uuid4's
            # hex, without building a UUID object: 0.8 us against 6 us, per item.
            command_id=f"cmd_{secrets.token_hex(16)}",
            run_id=run_id,
            issued_at=issued_at,
            correlation_id=items[index].attemptId,
            actor=who.name,
            attempt_id=items[index].attemptId,
            lease_epoch=items[index].leaseEpoch,
            sequence=items[index].sequence,
        )
        for index, run_id in run_of.items()
    }
    decisions = await _publish_all(ctx, commands)
    replays = [run_of[i] for i, d in decisions.items() if _is_replay(d)]
    # A replay is answered from the run as it stands (rare: a retried batch), so its whole
    # view is read, as a single heartbeat's replay reads it; one hop for all of them.
    views = await ctx.in_thread("the run views", ctx.deps.views.views, replays)
    watchdog = await ctx.in_thread(
        "the watchdog views",
        _watchdog_briefs,
        ctx,
        [run_of[i] for i, d in decisions.items() if isinstance(d, Decided) or _is_replay(d)],
    )
    for index, decision in decisions.items():
        item, run_id = items[index], run_of[index]
        run = views.get(run_id) if _is_replay(decision) else briefs.get(run_id)
        results[index] = _result(item, run_id, commands[index], decision, run, watchdog, path)
    answered = [r for r in results if r is not None]
    counts = {s: sum(1 for r in answered if r["status"] == s) for s in _STATUSES}
    return {"results": answered, **counts}


async def _publish_all(ctx: ApiContext, commands: dict[int, RenewLease]) -> dict[int, Decision | str | None]:
    """Every command published in RenewLeases envelopes (one record per partition), then every
    decision awaited together under one deadline, with one wake-up for the whole batch.

    An item is a Decision, None (durable, undecided in time) or why it is not durable (str).
    No command acknowledged at all is an outage of the whole request: 503 Retry-After."""
    if not commands:
        return {}
    d = ctx.deps
    loop = asyncio.get_running_loop()
    deadline = loop.time() + ctx.remaining()
    index_of = {command.command_id: index for index, command in commands.items()}
    group = d.decisions.register_many(list(index_of))
    try:
        envelopes = renewal_batch_records(d.codec, list(commands.values()), f"renew_{uuid.uuid4().hex}")
        produced: list[tuple[Future[int] | str, tuple[RenewLease, ...]]] = []
        for record, carried in envelopes:  # no await in between: one produce burst
            try:
                produced.append((d.publisher.publish(record), carried))
            except BufferError:
                produced.append(("the producer's queue is full; not sent", carried))
            except Exception as exc:
                produced.append((f"Kafka refused the command: {exc}", carried))
        # shield: giving up at the deadline must not cancel the producer's Futures.
        acks = [(asyncio.shield(asyncio.wrap_future(f)), c) for f, c in produced if not isinstance(f, str)]
        if acks:
            await asyncio.wait([ack for ack, _ in acks], timeout=max(0.0, deadline - loop.time()))
        failures = [(f, c) for f, c in produced if isinstance(f, str)]
        for ack, carried in acks:
            if not ack.done():
                failures.append(("Kafka did not acknowledge it in time; it may still be recorded", carried))
            elif ack.exception() is not None:
                failures.append((f"Kafka did not take it: {ack.exception()}", carried))
        outcome: dict[int, Decision | str | None] = {
            index_of[command.command_id]: why for why, carried in failures for command in carried
        }
        if len(outcome) == len(commands):
            raise ctx.unavailable(
                "Kafka acknowledged none of the renewals; sending the same batch again is safe "
                "(a repeated sequence is answered as a replay)"
            )
        d.decisions.release(group, [c.command_id for _, carried in failures for c in carried])
        await asyncio.wait([group.done], timeout=max(0.0, deadline - loop.time()))
        decided = d.decisions.decided(group)
        for command_id, index in index_of.items():
            if index not in outcome:
                outcome[index] = decided.get(command_id)
        return outcome
    finally:
        d.decisions.release(group, list(index_of))


def _is_replay(decision: Decision | str | None) -> bool:
    return isinstance(decision, Rejected) and decision.rejection.code == "DUPLICATE_SEQUENCE"


def _result(
    item: RenewalItem,
    run_id: str,
    command: RenewLease,
    decision: Decision | str | None,
    run: dict[str, Any] | None,
    watchdog: dict[str, dict[str, Any] | None],
    path: str,
) -> dict[str, Any]:
    """One item's answer; `run` is the brief read before publishing (an accepted renewal, as
    a heartbeat) or, for a replay, the whole view read after its decision."""
    base = {"attemptId": item.attemptId, "epoch": item.leaseEpoch, "sequence": item.sequence}
    pending = (watchdog.get(run_id) or {}).get("pendingIntervention")
    intervention = dict(pending) if isinstance(pending, dict) else None
    if isinstance(decision, Decided):
        event = decision.event
        before = run or {}
        return {
            **base,
            "status": "accepted",
            "expiresAt": getattr(event, "expires_at", None),
            "serverTime": event.occurred_at,
            "certainty": "active",
            "runStatus": "running"
            if getattr(event, "run_started", False)
            else before.get("status", "running"),
            **stop_fields(before),
            "watchdog": intervention,
        }
    if isinstance(decision, Rejected) and _is_replay(decision):
        # The same fields as an accepted item (the single heartbeat's replay answers the same).
        return {
            **base,
            "status": "replayed",
            "serverTime": decision.rejection.occurred_at,
            **replayed_fields(run or {}, item.attemptId),
            "watchdog": intervention,
        }
    if isinstance(decision, Rejected):
        r = decision.rejection
        slug = _ATTEMPT_OVERRIDES.get(r.code) or REJECTION_PROBLEMS.get(r.code, "command-rejected")
        return _refused(
            item,
            slug,
            r.detail,
            path,
            code=r.code,
            runId=r.run_id,
            currentStatus=r.current_status,
            commandId=r.causation_id,
        )
    if isinstance(decision, str):
        return {
            **base,
            "status": "unavailable",
            "problem": CATALOG.body("unavailable", f"{decision}; send it again", path),
            "commandId": command.command_id,
        }
    return {**base, "status": "pending", "commandId": command.command_id}
