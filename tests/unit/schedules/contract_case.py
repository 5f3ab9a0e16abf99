"""The Schedule's command generator for the aggregate contract (tests/contract, DUR-1, EXE-14):
creates (retried under one command id), bad definitions (refused), pauses, resumes, triggers,
updates and the follower's run outcomes, mixed with timer ticks that fire every-minute crons."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from typing import Any

from services.common.contracts.schedules import (
    PauseSchedule,
    RecordScheduledRun,
    ResumeSchedule,
    TriggerSchedule,
    UpdateSchedule,
)
from tests.unit.schedules.support import create

__all__ = ["SLOTS", "contract_commands", "fresh"]

SLOTS = tuple(f"sch_{i:016x}" for i in range(1, 5))
_HEADER = {"issued_at": 0, "correlation_id": "contract", "actor": "user:alice"}


def fresh(key: str) -> Any:
    """A command creating a new schedule, its id derived from `key` (any text)."""
    schedule_id = key if key.startswith("sch_") else "sch_" + hashlib.sha256(key.encode()).hexdigest()[:16]
    return create(run_id=schedule_id, command_id=f"create-{schedule_id}", cron="* * * * *", time_zone="UTC")


def contract_commands(rng: random.Random, load: Callable[[str], Any], step: int) -> list[Any]:
    commands: list[Any] = []
    for i in range(rng.randint(1, 5)):
        sid = rng.choice(SLOTS)
        state, tag = load(sid), f"{sid}-{step}-{i}"
        roll = rng.random()
        header = {**_HEADER, "run_id": sid}
        if state is None or roll < 0.1:
            overlap = "queue" if sid in SLOTS[:2] else "skip"
            commands.append(
                create(
                    run_id=sid,
                    command_id=f"create-{sid}",
                    cron="* * * * *",
                    time_zone="UTC",
                    overlap_policy=overlap,
                )
            )
        elif roll < 0.15:
            commands.append(create(run_id=sid, command_id=f"bad-{tag}", cron="99 * * * *"))
        elif roll < 0.3:
            commands.append(PauseSchedule(command_id=f"p-{tag}", **header))
        elif roll < 0.45:
            commands.append(ResumeSchedule(command_id=f"r-{tag}", **header))
        elif roll < 0.55:
            commands.append(TriggerSchedule(command_id=f"t-{tag}", **header))
        elif roll < 0.62:
            d = state.definition
            fields = {k: getattr(d, k) for k in d.__dataclass_fields__ if k != "labels"}
            commands.append(
                UpdateSchedule(command_id=f"u-{tag}", **header, **{**fields, "cron": "*/2 * * * *"})
            )
        elif state.active_runs:
            run_id = rng.choice(state.active_runs)
            outcome = rng.choice(("submitted", "ended", "ended", "refused"))
            commands.append(
                RecordScheduledRun(
                    command_id=f"run-{run_id}-{outcome}",
                    target_run_id=run_id,
                    outcome=outcome,
                    status="succeeded" if outcome == "ended" else "ADMISSION_QUEUE_FULL",
                    **header,
                )
            )
    return commands
