"""The values every golden sample starts from: a command's and an event's header (see make_golden.py)."""

from __future__ import annotations

__all__ = ["_COMMAND", "_EVENT", "_SPEC"]

_SPEC = '{"entrypoint":"agent run","image":"registry.local/agent@sha256:0f0e","resources":{"cpu":2}}'
_COMMAND = {
    "commandId": "cmd-7f3a9c",
    "runId": "run-0001",
    "issuedAt": 1_767_225_600_123,  # 2026-01-01T00:00:00.123Z
    "correlationId": "corr-42",
    "actor": "user:alice@example.org",
}
_EVENT = {
    "runId": "run-0001",
    "occurredAt": 1_767_225_600_456,
    "correlationId": "corr-42",
    "actor": "user:alice@example.org",
}
