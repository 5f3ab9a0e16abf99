"""The quarantine processor's commands for the aggregate contract suite (tests/contract)."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from services.common.contracts.quarantine import (
    ClearArtifacts,
    ClearQuarantine,
    RecordArtifactRead,
    RecordQuarantineStage,
    RegisterArtifact,
    StartQuarantine,
    TaintRun,
    graph_id,
)
from services.common.ids import run_id_for

__all__ = ["contract_commands", "fresh"]

RUNS = tuple(run_id_for("acme", f"q{i}") for i in range(3))
GRAPH = graph_id("acme")
ARTIFACTS = tuple(f"art_{i:032x}" for i in range(6))


def _header(aggregate: str, command_id: str, actor: str = "olga") -> dict[str, Any]:
    return {
        "command_id": command_id,
        "run_id": aggregate,
        "issued_at": 1,
        "correlation_id": "c",
        "actor": actor,
    }


def fresh(key: str) -> StartQuarantine:
    return _start(run_id_for("acme", key), f"start-{key}")


def _start(run: str, command_id: str) -> StartQuarantine:
    return StartQuarantine(
        **_header(run, command_id),
        trigger="operator",
        reason="suspected",
        evidence="",
        tenant="acme",
        holder="runner-a",
        lease_epoch=1,
        attempt_id="",
        taint_from_step=-1,
        taint_from_at=0,
    )


def contract_commands(rng: random.Random, load: Callable[[str], Any], step: int) -> list[Any]:
    out: list[Any] = []
    graph = load(GRAPH)
    known = sorted(graph.artifacts) if graph is not None else []
    for i in range(rng.randint(1, 6)):
        tag = f"{step}-{i}"
        run = rng.choice(RUNS)
        kind = rng.choice(("start", "stage", "clear", "register", "register", "read", "taint", "uncover"))
        if kind == "start":
            out.append(_start(run, f"s-{tag}"))
        elif kind == "stage":
            stage = rng.choice(("suspended", "severed", "revoked", "bogus"))
            out.append(
                RecordQuarantineStage(
                    **_header(run, f"g-{tag}", "runner-a"),
                    stage=stage,
                    mechanism="sigstop",
                    completed_at=5,
                    host_id="h",
                    detail="",
                )
            )
        elif kind == "clear":
            out.append(
                ClearQuarantine(
                    **_header(run, f"c-{tag}", rng.choice(("olga", "runner-a"))),
                    reason="ok",
                    evidence="",
                    role="operator",
                    artifact_ids=(),
                )
            )
        elif kind == "register":
            artifact = rng.choice(ARTIFACTS)
            parents = tuple(p for p in known if p != artifact and rng.random() < 0.3)
            out.append(
                RegisterArtifact(
                    **_header(GRAPH, f"r-{tag}", "runner"),
                    artifact_id=artifact,
                    producer_run_id=run,
                    attempt_id="",
                    step=rng.randint(-1, 3),
                    content_hash=f"sha256:{artifact}",
                    size_bytes=1,
                    media_type="text/plain",
                    source="upload",
                    location=artifact,
                    derived_from=parents,
                )
            )
        elif kind == "read":
            out.append(
                RecordArtifactRead(
                    **_header(GRAPH, f"d-{tag}", "peer"),
                    artifact_id=rng.choice(ARTIFACTS),
                    reader_run_id=run,
                    reader="peer",
                )
            )
        elif kind == "taint":
            out.append(
                TaintRun(
                    **_header(GRAPH, f"t-{tag}"),
                    tainted_run_id=run,
                    since_step=rng.randint(-1, 3),
                    since_at=0,
                    quarantine_event_id="q",
                )
            )
        else:
            out.append(
                ClearArtifacts(
                    **_header(GRAPH, f"u-{tag}"),
                    cleared_run_id=rng.choice(("", run)),
                    artifact_ids=tuple(a for a in known if rng.random() < 0.4),
                    reason="ok",
                    evidence="",
                    role=rng.choice(("operator", "runner")),
                )
            )
    return out
