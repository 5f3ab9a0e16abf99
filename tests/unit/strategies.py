"""Shared hypothesis strategies and command builders for the Run aggregate's tests.

The strategies deliberately draw from SMALL pools (three runs, a handful of specs, two spec texts
that differ only in key order) so that random sequences actually hit the interesting cases:
duplicate submissions, idempotency-key conflicts, cancels of unknown or terminal runs, and
redeliveries of a command already decided.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from services.common.contracts import CancelRun, RunCommand, SubmitRun
from services.common.ids import run_id_for

__all__ = [
    "RUN_SLOTS",
    "SPEC_TEXTS",
    "cancel_command",
    "command_sequences",
    "json_objects",
    "reversed_key_order_json",
    "submit_command",
]

# (tenant, idempotency key) pairs; each names exactly one run id.
RUN_SLOTS: tuple[tuple[str, str], ...] = (("acme", "key-1"), ("acme", "key-2"), ("globex", "key-1"))

# The first two texts are the same JSON object with its keys in a different order, so they must
# be treated as the same spec; the others differ.
SPEC_TEXTS: tuple[str, ...] = (
    '{"image":"registry.local/agent@sha256:aa","resources":{"cpu":2,"mem":"4Gi"}}',
    '{ "resources": {"mem": "4Gi", "cpu": 2}, "image": "registry.local/agent@sha256:aa" }',
    '{"image":"registry.local/agent@sha256:bb"}',
    '{"entrypoint":"agent run","env":{"MODE":"fast"}}',
)


def submit_command(
    tenant: str = "acme",
    idempotency_key: str = "key-1",
    spec: str = SPEC_TEXTS[0],
    *,
    command_id: str = "cmd-submit-1",
    run_id: str | None = None,
    timeout_seconds: int = 3600,
    max_attempts: int = 3,
    retry_safe: bool = False,
    actor: str = "user:alice",
    correlation_id: str = "corr-1",
) -> SubmitRun:
    return SubmitRun(
        command_id=command_id,
        run_id=run_id if run_id is not None else run_id_for(tenant, idempotency_key),
        issued_at=1_767_225_600_000,
        correlation_id=correlation_id,
        actor=actor,
        tenant=tenant,
        idempotency_key=idempotency_key,
        execution_spec=spec,
        retry_safe=retry_safe,
        timeout_seconds=timeout_seconds,
        max_attempts=max_attempts,
    )


def cancel_command(
    run_id: str,
    *,
    command_id: str = "cmd-cancel-1",
    reason: str = "no longer needed",
    actor: str = "user:alice",
    correlation_id: str = "corr-2",
) -> CancelRun:
    return CancelRun(
        command_id=command_id,
        run_id=run_id,
        issued_at=1_767_225_600_000,
        correlation_id=correlation_id,
        actor=actor,
        reason=reason,
    )


_JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)


def json_objects(max_leaves: int = 12) -> st.SearchStrategy[dict[str, Any]]:
    """JSON objects (nested dicts/lists of JSON scalars); what an ExecutionSpec may be."""
    values = st.recursive(
        _JSON_SCALARS,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
        max_leaves=max_leaves,
    )
    return st.dictionaries(st.text(max_size=6), values, max_size=5)


def reversed_key_order_json(value: Any) -> str:
    """The same JSON value serialised with every object's keys in reverse insertion order."""

    def reorder(node: Any) -> Any:
        if isinstance(node, dict):
            return {key: reorder(node[key]) for key in reversed(list(node))}
        if isinstance(node, list):
            return [reorder(item) for item in node]
        return node

    return json.dumps(reorder(value), indent=1)


# Submissions the domain must refuse, next to the well-formed kind most steps use.
_SUBMIT_FLAVOURS = ("ok", "ok", "ok", "ok", "bad_timeout", "bad_run_id", "not_an_object")


@st.composite
def command_sequences(draw: st.DrawFn, max_size: int = 20) -> list[RunCommand]:
    """A random stream of Run commands over RUN_SLOTS, including exact redeliveries.

    Every newly drawn command gets a fresh command id (`cmd-<n>`); a "redeliver" step repeats an
    earlier command object unchanged, as Kafka does after a consumer crash.
    """
    size = draw(st.integers(min_value=1, max_value=max_size))
    issued: list[RunCommand] = []
    stream: list[RunCommand] = []
    for step in range(size):
        kinds = ("submit", "submit", "cancel", "redeliver") if issued else ("submit", "cancel")
        kind = draw(st.sampled_from(kinds))
        if kind == "redeliver":
            stream.append(draw(st.sampled_from(issued)))
            continue
        tenant, key = draw(st.sampled_from(RUN_SLOTS))
        command: RunCommand
        if kind == "cancel":
            command = cancel_command(run_id_for(tenant, key), command_id=f"cmd-{step}", reason=f"r{step}")
        else:
            flavour = draw(st.sampled_from(_SUBMIT_FLAVOURS))
            spec = draw(st.sampled_from(SPEC_TEXTS))
            command = submit_command(
                tenant,
                key,
                '["not", "an", "object"]' if flavour == "not_an_object" else spec,
                command_id=f"cmd-{step}",
                run_id="run_forged" if flavour == "bad_run_id" else None,
                timeout_seconds=0 if flavour == "bad_timeout" else draw(st.sampled_from((60, 3600))),
                retry_safe=draw(st.booleans()),
            )
        issued.append(command)
        stream.append(command)
    return stream
