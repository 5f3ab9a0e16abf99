"""What the quarantine and artifact routes need: the fold of quarantine.events, its decisions.

`QuarantineDeps.board` is the QuarantineBoard (services.quarantine.view): every run's quarantine
and every tenant's provenance graph, folded with the processor's own `evolve`, answering from
memory (the mediation gateway's check before each read is a lookup). `decisions` follows
quarantine.events and quarantine.rejections for the answer to each command and wakes the
long-poll. `publish` is the one way the routes issue a quarantine command.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from services.command_api.context import ApiContext
from services.common.contracts.quarantine import QuarantineCommand
from services.common.decisions import (
    Decided,
    DecisionBook,
    NotDurable,
    Rejected,
    publish_and_await,
)
from services.quarantine.domain import QuarantineState
from services.quarantine.routing import quarantine_command_record
from services.quarantine.view import QuarantineFold

__all__ = ["QuarantineDeps", "publish", "quarantine_deps", "wait_for_version"]


@dataclass
class QuarantineDeps:
    board: QuarantineFold
    decisions: DecisionBook

    def close(self) -> None:
        self.board.close()
        self.decisions.close()


def quarantine_deps(ctx: ApiContext) -> QuarantineDeps:
    deps = ctx.deps.quarantine
    if deps is None:
        raise ctx.unavailable("the quarantine fold is not configured in this API")
    assert isinstance(deps, QuarantineDeps)
    return deps


async def publish(ctx: ApiContext, command: QuarantineCommand) -> Decided | Rejected | None:
    """Publish and wait for the decision within the request's deadline (None: durable, undecided)."""
    deps = quarantine_deps(ctx)
    record = quarantine_command_record(ctx.deps.codec, command)
    try:
        return await publish_and_await(
            ctx.deps.publisher, deps.decisions, record, command.command_id, ctx.remaining()
        )
    except NotDurable as exc:
        raise ctx.unavailable(
            f"{exc}; sending the same request again (same Idempotency-Key) is safe",
            commandId=command.command_id,
        ) from exc


async def wait_for_version(
    ctx: ApiContext, run_id: str, version: int, timeout_s: float
) -> QuarantineState | None:
    """The run's quarantine once the fold shows `version` (the decision follower may be ahead of
    the fold by a few milliseconds), or as it is when the time is up."""
    board = quarantine_deps(ctx).board
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(0.0, timeout_s)
    while True:
        state = board.quarantine(run_id)
        if (state is not None and state.version >= version) or loop.time() >= deadline:
            return state
        await asyncio.sleep(0.003)
