"""Values for the saga's and the watchdog's records, built field by field from their schemas."""

from __future__ import annotations

from typing import Any

__all__ = ["saga_sample"]

# The saga's records (tenure.trajectories.*, tenure.incidents.*) get values built from their
# declared fields: one plausible value per field name or type, so every field is non-default.
_SAGA_VALUES: dict[str, Any] = {
    "commandId": "cmd-saga-1",
    "eventId": "evt-saga-1",
    "runId": "run_a1000000000000000000000000000001",
    "issuedAt": 1_767_225_600_123,
    "occurredAt": 1_767_225_600_456,
    "correlationId": "corr-saga-1",
    "actor": "runner:runner-7",
    "causationId": "cmd-saga-1",
    "version": 3,
    "attemptId": "att_a1000000000000000000000000000001_1",
    "leaseEpoch": 1,
    "epoch": 1,
    "plan": '{"order":[{"after":[],"params":{"name":"web"},"stepId":"vm","tool":"vm.provision"}],'
    '"outbox":[],"pivot":null,"reordered":false}',
    "pivotApproval": "human",
    "tool": "vm.provision",
    "gatewayTool": "env",
    "operation": "vm.provision",
    "params": '{"name":"web"}',
    "output": '{"vmId":"vm-0f0e0d0c0b"}',
    "partialOutput": '{"ruleId":"rule-1a2b3c4d5e"}',
    "compensation": '{"costMoney":0.0,"costMs":45,"gatewayTool":"env","operation":"vm.terminate",'
    '"params":{"vmId":"vm-0f0e0d0c0b"}}',
    "idempotencyKey": "run_a1000000000000000000000000000001/s0/d1",
    "reversibility": "II",
    "status": "pending",
    "outcome": "committed",
    "errorKind": "conflict",
    "errorMessage": "the domain is owned by another tenant",
    "errorStatus": 409,
    "errorClass": "fatal",
    "signature": "490df786983f" + "0" * 52,
    "checks": '[{"detail":"epoch 1 held","name":"lease-active","passed":true}]',
    "verdict": "passed",
    "decision": "approve",
    "action": "BACKWARD_ROLLBACK",
    "gate": "gate-1-taxonomy",
    "inputs": '{"errorClass":"fatal","p":"0.5000"}',
    "severity": "fatal",
    "failureMode": "COMPENSATION_CORRUPTED",
    "resolution": "resume",
    "incidentId": "inc_7f3a9c",
    "errorContext": '{"kind":"auth-revoked","message":"credentials revoked"}',
    "uncompensated": '[{"stepIndex":1,"tool":"ip.reserve"}]',
    "snapshotRef": "tenure://trajectories/run_a1000000000000000000000000000001?version=9&sha256=ab",
    "logTopic": "trajectories.events",
}
# The semantic watchdog's records (tenure.watchdog.*, WD-1..WD-5) and the trajectory's side of
# them: hashes in their real shapes (16 hex digits of xxHash64, 64 of SHA-256).
_ACTION_HASH = "9f86d081884c7d65"
_STATE_A = "a19cb74e" + "0" * 56
_STATE_B = "c3e290ba" + "0" * 56
_SAGA_VALUES.update(
    {
        "source": "runner",
        "stepSeq": 7,
        "actionHash": _ACTION_HASH,
        "stateHash": _STATE_A,
        "summary": "FAILED tests/test_config.py::test_line_42 - 3 passed, 1 failed",
        "metrics": [3.0, -1.0],
        "detector": "cycle",
        "code": "STATE_OSCILLATION_DETECTED",
        "repeatedHashes": [_STATE_A, _STATE_B],
        "windowSteps": [5, 6, 7],
        "windowHashes": [_STATE_A, _STATE_B, _STATE_A],
        "metricHistory": "[[4.0,-1.0],[3.0,-1.0]]",
        "truncatedSteps": [5, 6, 7],
        "checkpointStateHash": _STATE_B,
        "restoredStateHash": _STATE_B,
        "origin": "run",
        "interventionId": "itv_7f3a9c",
        "detectionId": "det_7f3a9c",
        "message": "[SYSTEM ALERT: SEMANTIC_WATCHDOG_INTERRUPT] STATE_OSCILLATION_DETECTED (k=2)",
        # StartTrajectory v2, TrajectoryStarted v2 (QUA-2): the run's tenant, its graph's name.
        "tenant": "acme",
    }
)
_BY_TYPE: dict[str, Any] = {"string": "value", "long": 2, "double": 0.25, "boolean": True}


def saga_sample(declared: dict[str, Any]) -> dict[str, Any]:
    record: dict[str, Any] = {}
    for field in declared["fields"]:
        name, kind = field["name"], field["type"]
        if name in _SAGA_VALUES:
            record[name] = _SAGA_VALUES[name]
        elif isinstance(kind, dict) and kind.get("type") == "array":
            record[name] = [3, 2, 1]
        elif isinstance(kind, dict):
            record[name] = 1_767_225_600_789
        else:
            record[name] = f"{name}-1" if kind == "string" else _BY_TYPE[kind]
    return record
